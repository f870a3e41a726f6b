"""The quality aggregates against a small hand-computed world: two annotators, three tasks (one gold, one archived),
five trajectories, live and think-aloud steps, reviews, two model versions."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime

import psycopg
import pytest
from django.db import connection

from annotation_app.candidates import candidate
from annotation_app.models import Review, ReviewAssignment, Step, Task, Trajectory
from annotation_app.quality import aggregates, dashboard
from annotation_app.quality.models import AnnotatorStats, Coverage, ModelAcceptance, Refresh, Throughput

from ..factories import ModelVersionFactory, StepFactory, TaskFactory, TrajectoryFactory, UserFactory


def at(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 1, day, hour, minute, second, tzinfo=UTC)


def click(x: int = 10, y: int = 20) -> dict:
    return candidate(thought="Click it.", action_text=f"click(start_box='({x},{y})')")


def live_step(trajectory, index, created, seconds, **fields) -> Step:
    step = StepFactory(
        trajectory=trajectory,
        index=index,
        started_at=created,
        finished_at=created.replace(second=created.second + seconds),
        **fields,
    )
    Step.objects.filter(pk=step.pk).update(created_at=created)
    return step


def insitu_step(trajectory, index, created, span) -> Step:
    step = StepFactory(trajectory=trajectory, index=index, action={"actions": [], "t": list(span)})
    Step.objects.filter(pk=step.pk).update(created_at=created)
    return step


@pytest.fixture
def world(db):
    a1, a2 = UserFactory(username="ann-a"), UserFactory(username="ann-b")
    lead = UserFactory(username="lead", role="data_lead")
    mv1, mv2 = ModelVersionFactory(name="policy-1"), ModelVersionFactory(name="policy-2")
    gold = TaskFactory(domain="chrome", platform=Task.Platform.BROWSER, difficulty=2, is_gold=True)
    plain = TaskFactory(domain="calc", platform=Task.Platform.DESKTOP, difficulty=3, status=Task.Status.COMPLETED)
    TaskFactory(domain="gone", status=Task.Status.ARCHIVED)

    def traj(annotator, task, status, submitted=None, reward=None):
        return TrajectoryFactory(
            annotator=annotator, task=task, status=status, submitted_at=submitted, outcome_reward=reward
        )

    t1 = traj(a1, gold, Trajectory.Status.SUBMITTED, at(5, 10, 30), 1.0)
    t2 = traj(a1, plain, Trajectory.Status.APPROVED, at(6, 9))
    t3 = traj(a2, gold, Trajectory.Status.REJECTED, at(5, 12), 0.0)
    t4 = traj(a2, plain, Trajectory.Status.APPROVED, at(7, 12))
    t5 = traj(a1, plain, Trajectory.Status.IN_PROGRESS)

    # a1, live on the gold task: 4 s and 10 s; the first proposal accepted (click), the second overridden.
    accepted = click()
    live_step(t1, 0, at(5, 10, 10), 4, candidates=[accepted], chosen_candidate=0, model_version=mv1,
              action_text=accepted["action_text"])  # fmt: skip
    typing = candidate(thought="Type.", action_text="type(content='x')")
    live_step(t1, 1, at(5, 10, 20), 10, candidates=[typing], chosen_candidate=None, model_version=mv1)
    # a1, think-aloud: actions end at 2.0, 5.0 and 9.0 s on the capture's clock: 2, 3 and 4 s per step.
    for index, span in enumerate([(0.5, 2.0), (3.0, 5.0), (6.0, 9.0)]):
        insitu_step(t2, index, at(6, 8, 50), span)
    # a1, in progress: one untimed step (counted, not timed).
    step = StepFactory(trajectory=t5, index=0)
    Step.objects.filter(pk=step.pk).update(created_at=at(6, 9, 30))
    # a2: a proposal of policy-2 chosen, then its action changed (edited).
    live_step(t3, 0, at(5, 11, 59), 6, candidates=[click(1, 1)], chosen_candidate=0, model_version=mv2,
              action_text="click(start_box='(5,5)')")  # fmt: skip

    review = Review.objects.create
    review(trajectory=t2, reviewer=lead, verdict=Review.Verdict.APPROVE)
    review(trajectory=t3, reviewer=lead, verdict=Review.Verdict.REJECT)
    first = review(trajectory=t4, reviewer=lead, verdict=Review.Verdict.REJECT)
    latest = review(trajectory=t4, reviewer=lead, verdict=Review.Verdict.APPROVE)
    Review.objects.filter(pk=first.pk).update(created_at=at(7, 13))
    Review.objects.filter(pk=latest.pk).update(created_at=at(7, 14))
    ReviewAssignment.objects.create(trajectory=t1, reviewer=lead)
    return {"a1": a1, "a2": a2, "mv1": mv1, "mv2": mv2}


def test_annotator_figures(world):
    done = aggregates.refresh("test")
    assert done.status == Refresh.Status.DONE and done.as_of is not None
    a1 = AnnotatorStats.objects.get(annotator=world["a1"])
    a2 = AnnotatorStats.objects.get(annotator=world["a2"])
    assert (a1.trajectories, a1.steps, a1.active_hours, a1.active_days) == (2, 6, 3, 2)
    assert (a2.trajectories, a2.steps, a2.active_hours, a2.active_days) == (2, 1, 3, 2)
    assert a1.median_step_s == pytest.approx(4.0)  # of 4, 10, 2, 3, 4
    assert a2.median_step_s == pytest.approx(6.0)
    assert (a1.reviewed, a1.passed, a2.reviewed, a2.passed) == (1, 1, 2, 1)  # t4's latest review counts
    assert (a1.gold_scored, a1.gold_accuracy, a2.gold_scored, a2.gold_accuracy) == (1, 1.0, 1, 0.0)
    # Gold task: a1 right (reward 1), a2 wrong (0): disagree. Plain task: both approved: agree.
    assert (a1.peer_pairs, a1.peer_agreed) == (2, 1)
    assert a1.peer_agreement == pytest.approx(0.5)
    # The same through annotation_app.agreement (the latest finished trajectory per annotator and task).
    assert (a1.peer_tasks, a1.peer_outcome, a2.peer_tasks, a2.peer_outcome) == (2, 0.5, 2, 0.5)
    assert a1.trajectories_per_hour == pytest.approx(2 / 3) and a1.steps_per_day == pytest.approx(3.0)
    assert not AnnotatorStats.objects.exclude(annotator__in=[world["a1"], world["a2"]]).exists()


def test_simulated_annotators_are_not_in_the_human_figures(world):
    """Their work is a program's: it stays out of the per-annotator and throughput tables (acceptance keeps it)."""
    robot = UserFactory(is_simulated=True)
    trajectory = TrajectoryFactory(
        annotator=robot, simulated=True, status=Trajectory.Status.SUBMITTED, submitted_at=at(5, 9)
    )
    live_step(trajectory, 0, at(5, 9), 3)
    aggregates.refresh("test")
    assert not AnnotatorStats.objects.filter(annotator=robot).exists()
    assert not Throughput.objects.filter(annotator=robot).exists()
    total = {(r.day, r.trajectories) for r in Throughput.objects.filter(annotator__isnull=True)}
    assert (date(2026, 1, 5), 2) in total, "the day's total counts the two people's trajectories only"


def test_throughput_per_day(world):
    aggregates.refresh("test")
    total = {(r.day, r.trajectories, r.steps) for r in Throughput.objects.filter(annotator__isnull=True)}
    assert total == {(date(2026, 1, 5), 2, 3), (date(2026, 1, 6), 1, 4), (date(2026, 1, 7), 1, 0)}
    a1 = {(r.day, r.trajectories, r.steps) for r in Throughput.objects.filter(annotator=world["a1"])}
    assert a1 == {(date(2026, 1, 5), 1, 2), (date(2026, 1, 6), 1, 4)}


def test_acceptance_per_model_and_action_type(world):
    aggregates.refresh("test")
    rows = {
        (r.model_version_id, r.action_type): (r.proposals, r.accepted, r.edited, r.overridden)
        for r in ModelAcceptance.objects.all()
    }
    mv1, mv2 = world["mv1"].pk, world["mv2"].pk
    assert rows == {
        (mv1, ""): (2, 1, 0, 1),
        (mv1, "click"): (1, 1, 0, 0),
        (mv1, "type"): (1, 0, 0, 1),
        (mv2, ""): (1, 0, 1, 0),
        (mv2, "click"): (1, 0, 1, 0),
    }
    models = dashboard.acceptance_by_model(dashboard.acceptance_rows())
    assert [m["name"] for m in models] == ["policy-1", "policy-2"]
    assert dashboard.plots(models)["acceptance"]["accepted"] == [50.0, 0.0]


def test_coverage_and_backlog(world):
    done = aggregates.refresh("test")
    rows = {(r.dimension, r.key): (r.count, r.completed) for r in Coverage.objects.all()}
    assert rows == {
        ("domain", "chrome"): (1, 0),
        ("domain", "calc"): (1, 1),
        ("platform", "browser"): (1, 0),
        ("platform", "desktop"): (1, 1),
        ("difficulty", "2"): (1, 0),
        ("difficulty", "3"): (1, 1),
        ("trajectory_status", "submitted"): (1, 0),
        ("trajectory_status", "approved"): (2, 0),
        ("trajectory_status", "rejected"): (1, 0),
        ("trajectory_status", "in_progress"): (1, 0),
    }
    assert (done.backlog_unreviewed, done.backlog_assigned, done.backlog_oldest) == (1, 1, at(5, 10, 30))


def test_a_refresh_replaces_the_previous_figures(world):
    aggregates.refresh("test")
    Trajectory.objects.filter(annotator=world["a2"]).delete()
    aggregates.refresh("test")
    assert list(AnnotatorStats.objects.values_list("username", flat=True)) == ["ann-a"]
    assert aggregates.latest() == Refresh.objects.order_by("-id").first()


def test_csv_tables(world):
    aggregates.refresh("test")
    rows = list(csv.DictReader(io.StringIO(dashboard.table_csv("annotators"))))
    assert [(r["annotator"], r["trajectories"], r["gold_accuracy_pct"]) for r in rows] == [
        ("ann-a", "2", "100.0"),
        ("ann-b", "2", "0.0"),
    ]
    acceptance = list(csv.DictReader(io.StringIO(dashboard.table_csv("acceptance"))))
    assert {(r["model"], r["action_type"], r["accepted_pct"]) for r in acceptance} >= {("policy-1", "(all)", "50.0")}
    for name in dashboard.TABLES:
        assert dashboard.table_csv(name).count("\n") > 1
    with pytest.raises(dashboard.UnknownTable):
        dashboard.table_csv("salaries")


def test_a_refresh_is_skipped_while_another_holds_the_lock(world):
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [aggregates.LOCK_KEY])
        assert aggregates.refresh("test") is None
        other.execute("SELECT pg_advisory_unlock(%s)", [aggregates.LOCK_KEY])
    assert aggregates.refresh("test") is not None


def test_gold_accuracy_matches_the_gold_module(world):
    """The dashboard's gold accuracy is the one annotation_app.gold computes (a mean reward), read in one pass."""
    gold = pytest.importorskip("annotation_app.gold")
    aggregates.refresh("test")
    mine = {s.annotator_id: s.gold_accuracy for s in AnnotatorStats.objects.filter(gold_scored__gt=0)}
    assert mine == pytest.approx(gold.gold_accuracy())


def test_peer_means_weigh_each_pair_by_its_shared_tasks():
    pairs = [
        {"annotators": (1, 2), "tasks": 3, "outcome_agreement": 1.0, "first_step_agreement": None, "similarity": 0.5},
        {"annotators": (1, 3), "tasks": 1, "outcome_agreement": 0.0, "first_step_agreement": 1.0, "similarity": 0.9},
    ]
    means = aggregates.peer_means(pairs)
    assert means[1] == {"peer_tasks": 4, "peer_outcome": 0.75, "peer_first_step": 1.0, "peer_similarity": 0.6}
    assert means[2] == {"peer_tasks": 3, "peer_outcome": 1.0, "peer_first_step": None, "peer_similarity": 0.5}
