"""The review queue: sampling policy, priority order, flag filter, never one's own, and no double hand-out under
concurrency (16 reviewers on their own connections)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from annotation_app import review_queue, rubric
from annotation_app.models import ProjectSettings, ReviewAssignment, Role, Trajectory
from annotation_app.trajectories import typed_action
from tests.factories import StepFactory, TaskFactory, TrajectoryFactory, UserFactory

T0 = timezone.now() - timedelta(days=1)


def submitted(annotator, minutes: int = 0, **kwargs) -> Trajectory:
    """A submitted trajectory of `annotator`, submitted `minutes` after T0."""
    return TrajectoryFactory(
        annotator=annotator,
        status=Trajectory.Status.SUBMITTED,
        submitted_at=T0 + timedelta(minutes=minutes),
        **kwargs,
    )


def queue_ids(reviewer=None, **kwargs) -> list[int]:
    return [e.trajectory_id for e in review_queue.pending_reviews(reviewer, low_tasks=[], **kwargs)]


def test_sample_value_is_stable_and_spread():
    values = [review_queue.sample_value(i) for i in range(1, 2001)]
    assert values[:5] == [review_queue.sample_value(i) for i in range(1, 6)]
    assert all(0 <= v < 1 for v in values)
    assert 0.4 < sum(v < 0.5 for v in values) / len(values) < 0.6


@pytest.mark.django_db
def test_first_n_then_a_stable_share_and_sql_agrees_with_python(make_user):
    ProjectSettings.objects.create(project="", review_first_n=3, review_share=0.5)
    annotator = make_user(Role.ANNOTATOR)
    made = [submitted(annotator, minutes=i) for i in range(40)]
    expected = {
        t.pk
        for rank, t in enumerate(made, start=1)
        if review_queue.review_reason(rank, 3, 0.5, t.pk, flagged=False, low=False)
    }
    assert set(queue_ids(limit=100)) == expected
    assert {t.pk for t in made[:3]} <= expected and 3 < len(expected) < 40
    assert queue_ids(limit=100) == queue_ids(limit=100)  # stable on re-evaluation
    ProjectSettings.objects.filter(project="").update(review_share=0.0)
    assert queue_ids(limit=100) == [t.pk for t in made[:3]]


@pytest.mark.django_db
def test_priority_new_annotators_then_low_agreement_then_flags_then_oldest(make_user):
    ProjectSettings.objects.create(project="", review_first_n=1, review_share=0.0)
    veteran, newcomer = make_user(Role.ANNOTATOR), make_user(Role.ANNOTATOR)
    submitted(veteran, 0)  # the veteran's first: reviewed as new, long ago
    plain = submitted(veteran, 1)  # not sampled (share 0)
    flagged_late = submitted(veteran, 30, flags=[{"kind": "near_duplicate", "detail": "x"}])
    flagged_early = submitted(veteran, 20, flags=[{"kind": "not_executable"}])
    low = submitted(veteran, 40)
    newest = submitted(newcomer, 50)
    order = queue_ids(limit=10)
    first = order[0]
    assert order[1:] == [newest.pk, flagged_early.pk, flagged_late.pk] and plain.pk not in order
    assert Trajectory.objects.get(pk=first).annotator == veteran
    with_low = [e.trajectory_id for e in review_queue.pending_reviews(low_tasks=[low.task_id])]
    assert with_low == [first, newest.pk, low.pk, flagged_early.pk, flagged_late.pk]
    assert queue_ids(flag="near_duplicate") == [flagged_late.pk]
    assert set(review_queue.flag_kinds_in_queue()) == {"near_duplicate", "not_executable"}


@pytest.mark.django_db
def test_a_reviewer_never_gets_their_own_and_a_verdict_finishes_the_assignment(make_user):
    ProjectSettings.objects.create(project="", review_first_n=5, review_share=0.0)
    boss = make_user("superuser")
    own = submitted(boss, 0)
    other = submitted(make_user(Role.ANNOTATOR), 1, task=TaskFactory())
    assignment = review_queue.next_review(boss)
    assert assignment.trajectory_id == other.pk and assignment.reason == "new_annotator"
    assert review_queue.next_review(boss).pk == assignment.pk  # asked again: the same one
    verdict = rubric.Verdict("approve", {"efficient": 4})
    rubric.record_verdict(other, boss, verdict)
    assert ReviewAssignment.objects.get(pk=assignment.pk).status == ReviewAssignment.Status.DONE
    with pytest.raises(review_queue.ReviewQueueEmpty):
        review_queue.next_review(boss)
    assert own.pk not in queue_ids(boss)


@pytest.mark.django_db
def test_release_gives_the_trajectory_back(lead, make_user):
    t = submitted(make_user(Role.ANNOTATOR))
    assert review_queue.next_review(lead).trajectory_id == t.pk
    assert queue_ids() == []
    assert review_queue.release_review(lead) == 1
    assert queue_ids() == [t.pk]


@pytest.mark.django_db(transaction=True)
def test_concurrent_reviewers_never_get_the_same_trajectory():
    """16 reviewers ask at the same instant, each on its own connection; 10 trajectories: each goes to exactly one."""
    n_reviewers, n_trajectories = 16, 10
    reviewers = [UserFactory(role=Role.DATA_LEAD) for _ in range(n_reviewers)]
    annotator = UserFactory(role=Role.ANNOTATOR)
    ProjectSettings.objects.create(project="", review_first_n=n_trajectories, review_share=0.0)
    for i in range(n_trajectories):
        submitted(annotator, i)
    barrier = threading.Barrier(n_reviewers)
    got: list[int] = []
    empty: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(reviewer):
        try:
            barrier.wait()
            try:
                assignment = review_queue.next_review(reviewer)
                with lock:
                    got.append(assignment.trajectory_id)
            except review_queue.ReviewQueueEmpty:
                with lock:
                    empty.append(reviewer.pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(r,)) for r in reviewers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(got) == n_trajectories and len(set(got)) == n_trajectories, "a trajectory went to two reviewers"
    assert len(empty) == n_reviewers - n_trajectories
    assert ReviewAssignment.objects.filter(status="active").count() == n_trajectories


@pytest.mark.django_db
def test_queue_page_takes_next_and_filters(client, lead, make_user):
    ProjectSettings.objects.create(project="", review_first_n=0, review_share=0.0)
    annotator = make_user(Role.ANNOTATOR)
    dup = submitted(annotator, 0, flags=[{"kind": "near_duplicate"}])
    submitted(annotator, 1, flags=[{"kind": "divergent_steps"}])
    client.force_login(lead)
    page = client.get(reverse("lead-review-queue"), {"flag": "near_duplicate"}).content.decode()
    assert f"#{dup.pk}" in page and "divergent_steps" in page  # the filter's choices list every kind
    response = client.post(reverse("lead-review-next"), {"flag": "near_duplicate"})
    assert response.status_code == 302
    assert ReviewAssignment.objects.get(reviewer=lead).trajectory_id == dup.pk
    page = client.get(reverse("lead-review-queue")).content.decode()
    assert reverse("lead-trajectory-verdict", args=[dup.pk]) in page
    client.post(reverse("lead-review-release"))
    client.post(reverse("lead-review-next"), {"flag": "nothing_like_it"})
    assert not ReviewAssignment.objects.filter(status="active").exists()
    nothing = client.post(reverse("lead-review-next"), {"flag": "nothing_like_it"}, HTTP_HX_REQUEST="true")
    assert nothing.status_code == 200 and "No trajectories are waiting" in nothing.content.decode()


@pytest.mark.django_db
def test_low_agreement_tasks_come_from_the_agreement_module(make_user):
    """Two annotators who disagree on one task (outcome, first action, sequence): their trajectories move ahead of a
    flagged one, through annotation_app.agreement, not a list given by the test."""
    ProjectSettings.objects.create(project="", review_first_n=0, review_share=0.0)
    flagged = submitted(make_user(Role.ANNOTATOR), 0, flags=[{"kind": "near_duplicate"}])
    task = TaskFactory(required_annotations=2)
    pair = []
    for minutes, action_text, reward in ((5, "click(start_box='(10,20)')", 1.0), (6, "type(content='hi')", 0.0)):
        trajectory = submitted(make_user(Role.ANNOTATOR), minutes, task=task, outcome_reward=reward)
        StepFactory(trajectory=trajectory, index=0, action_text=action_text, action=typed_action(action_text))
        pair.append(trajectory.pk)
    assert task.pk in review_queue.low_agreement_task_ids()
    entries = review_queue.pending_reviews()
    assert [e.trajectory_id for e in entries] == [*pair, flagged.pk]
    assert [e.reason for e in entries] == ["low_agreement", "low_agreement", "flagged"]
