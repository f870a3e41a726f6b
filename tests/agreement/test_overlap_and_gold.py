"""Agreement, gold accuracy, gold mixing and adjudication against the database: hand-built annotations of known
figures, the queue's gold share, the lead's pages and their answers to bad input."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from annotation_app import adjudication, agreement, gold, task_queue
from annotation_app.models import Adjudication, ProjectSettings, Review, Role, Task, Trajectory
from annotation_app.task_import import TaskImportError, import_tasks

from ..factories import StepFactory, TaskFactory, TrajectoryFactory

pytestmark = pytest.mark.django_db


def annotate(task: Task, annotator, actions: list[str], *, outcome=None, status=Trajectory.Status.SUBMITTED):
    """A finished trajectory of `task` by `annotator` whose steps take `actions` (UI-TARS action texts)."""
    from annotation_app.trajectories import typed_action

    trajectory = TrajectoryFactory(
        task=task, annotator=annotator, status=status, outcome_reward=outcome, screen_width=1000, screen_height=1000
    )
    for i, text in enumerate(actions):
        StepFactory(trajectory=trajectory, index=i, action_text=text, action=typed_action(text))
    return trajectory


@pytest.fixture
def three(make_user):
    return [make_user(Role.ANNOTATOR) for _ in range(3)]


def test_task_and_pair_agreement_from_the_database(three, make_user):
    a, b, c = three
    agreed, split = TaskFactory(required_annotations=2), TaskFactory(required_annotations=2)
    annotate(agreed, a, ["click(start_box='(100,100)')", "type(content='hi')"], outcome=1.0)
    annotate(agreed, b, ["click(start_box='(110,105)')", "type(content='hi')"], outcome=1.0)
    annotate(split, a, ["click(start_box='(100,100)')"], outcome=1.0)
    annotate(split, c, ["hotkey(key='ctrl s')"], outcome=0.0)
    annotate(TaskFactory(), a, ["wait()"])  # one annotation only: not overlapping
    annotate(split, make_user(Role.ANNOTATOR), ["wait()"], status=Trajectory.Status.IN_PROGRESS)  # not finished

    result = agreement.task_agreement(agreed.pk)
    assert (result["outcome_agreement"], result["first_step_agreement"], result["similarity"]) == (1.0, 1.0, 1.0)
    low = agreement.task_agreement(split.pk)
    assert (low["outcome_agreement"], low["first_step_agreement"], low["similarity"]) == (0.0, 0.0, 0.0)
    assert agreement.low_agreement_task_ids(0.5) == [split.pk]
    assert agreement.task_agreement(TaskFactory().pk) is None
    pairs = {row["annotators"]: row for row in agreement.pair_agreement()}
    assert pairs[(a.pk, b.pk)]["tasks"] == 1 and pairs[(a.pk, b.pk)]["similarity"] == 1.0
    assert pairs[(a.pk, c.pk)]["outcome_agreement"] == 0.0


def test_element_boxes_decide_the_first_step(three):
    a, b, _ = three
    task = TaskFactory(metadata={"initial_elements": [[0, 0, 400, 100], "junk"]})
    annotate(task, a, ["click(start_box='(10,50)')"])
    annotate(task, b, ["click(start_box='(390,50)')"])  # 380 px apart, one button
    assert agreement.task_agreement(task.pk)["first_step_agreement"] == 1.0


def test_outcome_falls_back_to_review_verdicts_and_alpha_uses_rubric_scores(three, make_user):
    a, b, _ = three
    task = TaskFactory()
    one, two = annotate(task, a, ["wait()"]), annotate(task, b, ["wait()"])
    r1, r2 = make_user(Role.DATA_LEAD), make_user(Role.DATA_LEAD)
    for trajectory, verdict, scores in ((one, "approve", (5, 4)), (two, "reject", (1, 2))):
        for reviewer in (r1, r2):
            Review.objects.create(
                trajectory=trajectory, reviewer=reviewer, verdict=verdict, scores={"done": scores[0], "eff": scores[1]}
            )
    result = agreement.task_agreement(task.pk)
    assert result["outcome_agreement"] == 0.0  # approve against reject
    assert result["alpha"] == pytest.approx(1.0)  # both reviewers gave the same scores throughout


def test_gold_accuracy_is_the_mean_verifier_outcome_on_gold_tasks(three):
    a, b, c = three
    gold_1, gold_2 = TaskFactory(is_gold=True), TaskFactory(is_gold=True)
    annotate(gold_1, a, ["wait()"], outcome=1.0)
    annotate(gold_2, a, ["wait()"], outcome=0.0)
    annotate(gold_1, b, ["wait()"], outcome=1.0)
    annotate(TaskFactory(), c, ["wait()"], outcome=0.0)  # not gold
    annotate(gold_2, b, ["wait()"], outcome=0.0, status=Trajectory.Status.IN_PROGRESS)  # not finished
    assert gold.gold_accuracy() == {a.pk: 0.5, b.pk: 1.0}
    assert gold.gold_accuracy([c.pk, a.pk]) == {c.pk: None, a.pk: 0.5}


def test_the_queue_mixes_gold_in_at_the_project_rate(make_user):
    """With gold and ordinary tasks always available, the share of gold hand-outs follows the gold rate."""
    ProjectSettings.objects.create(project="p", gold_rate=0.25)
    ProjectSettings.objects.create(project="none", gold_rate=0.0)
    TaskFactory.create_batch(3, project="p", is_gold=True, importance=-5)
    TaskFactory.create_batch(3, project="none", is_gold=True, importance=-5)
    TaskFactory.create_batch(3, project="p", importance=5)
    handed = {"gold": 0, "other": 0}
    users = [make_user(Role.ANNOTATOR) for _ in range(80)]
    for user in users:
        task = task_queue.next_task(user).task
        assert not (task.is_gold and task.project == "none"), "a project with rate 0 never hands out gold"
        handed["gold" if task.is_gold else "other"] += 1
        Task.objects.filter(pk=task.pk).update(status=Task.Status.PENDING)  # keep every task available
    expected = sum(gold.draw(u.pk, 0) < 0.25 for u in users)  # the draws are deterministic
    assert handed["gold"] == expected
    assert 4 <= expected <= 40  # and uniform enough: 25 % of 80 is 20 (sd 3.9; this bound fails once in 10^4)


def test_gold_tasks_stay_open_and_every_annotator_does_each_once(three):
    a, b, _ = three
    task = TaskFactory(is_gold=True)
    for user in (a, b):
        assert task_queue.next_task(user).task == task
        task_queue.complete_assignment(user, task)
    task.refresh_from_db()
    assert task.status == Task.Status.PENDING
    with pytest.raises(task_queue.QueueEmpty):
        task_queue.next_task(a)


def test_import_asks_for_k_per_task_and_per_batch():
    batch = {
        "required_annotations": 3,
        "tasks": [{"instruction": "one"}, {"instruction": "two", "required_annotations": 2}],
    }
    result = import_tasks(json.dumps(batch).encode(), "batch.json")
    assert sorted(Task.objects.filter(pk__in=result.task_ids).values_list("required_annotations", flat=True)) == [2, 3]
    with pytest.raises(TaskImportError) as bad:
        import_tasks(b'{"instruction": "x", "required_annotations": 0}', "t.json")
    assert "required_annotations" in str(bad.value) and "between 1 and 20" in str(bad.value)
    with pytest.raises(TaskImportError) as bad:
        import_tasks(b'{"instruction": "x", "is_gold": true}', "t.json")
    assert "needs an evaluator" in str(bad.value)


def test_lead_sets_k_and_gold_on_the_task_page(client, lead):
    task = TaskFactory(evaluator={})
    client.force_login(lead)
    url = reverse("lead-task-overlap", args=[task.pk])
    assert client.post(url, {"required_annotations": "3"}).status_code == 302
    task.refresh_from_db()
    assert (task.required_annotations, task.is_gold) == (3, False)
    for form, reason in (
        ({"required_annotations": "many"}, "whole number"),
        ({"required_annotations": "0"}, "between 1 and 20"),
        ({"required_annotations": "2", "is_gold": "on"}, "needs an evaluator"),
    ):
        response = client.post(url, form)
        assert response.status_code == 400 and reason in response.content.decode()
    assert "Dual annotation and gold" in client.get(reverse("lead-task", args=[task.pk])).content.decode()


def test_adjudication_keeps_the_chosen_one_and_rejects_the_others(three, lead):
    a, b, c = three
    task = TaskFactory(required_annotations=3)
    ta = annotate(task, a, ["click(start_box='(100,100)')", "wait()"])
    tb = annotate(task, b, ["click(start_box='(900,900)')"], status=Trajectory.Status.APPROVED)
    tc = annotate(task, c, ["click(start_box='(100,100)')", "hotkey(key='ctrl s')"])
    rows = adjudication.side_by_side(adjudication.candidates(task))
    assert [r["same"] for r in rows] == [False, False]
    assert [cell["differs"] for cell in rows[0]["cells"]] == [False, True, False]  # b is the odd one out

    adjudication.adjudicate(task, lead, str(tb.pk), "b found the right menu")
    statuses = {t.pk: t.status for t in Trajectory.objects.filter(task=task)}
    assert statuses == {ta.pk: "rejected", tb.pk: "approved", tc.pk: "rejected"}
    adjudication.adjudicate(task, lead, str(ta.pk))  # the lead changes their mind
    statuses = {t.pk: t.status for t in Trajectory.objects.filter(task=task)}
    assert statuses == {ta.pk: "submitted", tb.pk: "rejected", tc.pk: "rejected"}
    tb.refresh_from_db()
    assert tb.metadata["adjudicated_out"]["previous_status"] == "approved"
    adjudication.adjudicate(task, lead, "neither")
    assert set(Trajectory.objects.filter(task=task).values_list("status", flat=True)) == {"rejected"}
    assert Adjudication.objects.filter(task=task).count() == 3
    with pytest.raises(adjudication.AdjudicationRefused, match="Choose one of"):
        adjudication.adjudicate(task, lead, "12345678")


def test_adjudication_pages_answer_bad_input_with_400(client, lead, three):
    a, b, _ = three
    task = TaskFactory()
    one = annotate(task, a, ["click(start_box='(100,100)')"], outcome=1.0)
    annotate(task, b, ["hotkey(key='ctrl s')"], outcome=0.0)
    client.force_login(lead)
    page = client.get(reverse("lead-agreement")).content.decode()
    assert reverse("lead-adjudicate", args=[task.pk]) in page
    assert client.get(reverse("lead-agreement"), {"threshold": "lots"}).status_code == 400
    assert client.get(reverse("lead-agreement"), {"threshold": "2"}).status_code == 400
    url = reverse("lead-adjudicate", args=[task.pk])
    body = client.get(url).content.decode()
    assert "click(start_box=" in body and "hotkey(key=" in body
    assert client.post(url, {}).status_code == 400
    response = client.post(url, {"chosen": "abc"})
    assert response.status_code == 400 and "Choose one of" in response.content.decode()
    assert client.post(url, {"chosen": str(one.pk), "note": "right app"}).status_code == 302
    assert "stands" in client.get(url).content.decode()
    lonely = TaskFactory()
    annotate(lonely, a, ["wait()"])
    assert client.post(reverse("lead-adjudicate", args=[lonely.pk]), {"chosen": "neither"}).status_code == 400


def test_cached_agreements_follow_every_change(three, lead):
    a, b, _ = three
    task = TaskFactory()
    annotate(task, a, ["wait()"], outcome=1.0)
    second = annotate(task, b, ["wait()"], outcome=1.0)
    assert agreement.cached_task_agreements()[task.pk]["outcome_agreement"] == 1.0
    Trajectory.objects.filter(pk=second.pk).update(outcome_reward=0.0)  # no updated_at change
    assert agreement.cached_task_agreements()[task.pk]["outcome_agreement"] == 0.0
    adjudication.adjudicate(task, lead, "neither")
    assert agreement.cached_task_agreements() == agreement.all_task_agreements()
