"""Which changes emit which webhook events: once, on the transition, to subscribed and active webhooks only."""

from __future__ import annotations

import json

import pytest

from annotation_app import trajectories
from annotation_app.models import Review, Task, Trajectory
from annotation_app.webhooks import manage
from annotation_app.webhooks.events import emit, redeliver
from annotation_app.webhooks.models import Delivery, Event
from flywheel.models import Iteration, ModelPromotion

from ..factories import AssignmentFactory, ModelVersionFactory, StepFactory, TrajectoryFactory


@pytest.fixture
def hook(db):
    return manage.create("http://127.0.0.1:9/hook", manage.SUBSCRIBABLE, "everything", by=None)


def _events(hook) -> list[str]:
    return sorted(Delivery.objects.filter(webhook=hook).values_list("event", flat=True))


def _data(hook, event: str) -> dict:
    return json.loads(Delivery.objects.get(webhook=hook, event=event).body)["data"]


def test_submission_emits_submitted_and_completes_the_task_once(hook, django_capture_on_commit_callbacks):
    assignment = AssignmentFactory()
    trajectory = TrajectoryFactory(task=assignment.task, annotator=assignment.annotator)
    StepFactory(trajectory=trajectory, index=0)
    with django_capture_on_commit_callbacks(execute=True):
        trajectories.submit(trajectory)
    assert _events(hook) == ["task.completed", "trajectory.submitted"]
    assert _data(hook, "task.completed")["task"]["id"] == assignment.task_id
    trajectory.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        trajectory.save()  # saving again without a change emits nothing
    assert _events(hook) == ["task.completed", "trajectory.submitted"]


def test_review_and_flags_emit_reviewed_and_flagged(hook, make_user, django_capture_on_commit_callbacks):
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    Delivery.objects.all().delete()
    Review.objects.create(trajectory=trajectory, reviewer=make_user("data_lead"), verdict="approve", scores={"a": 4})
    assert _data(hook, "trajectory.reviewed")["review"]["scores"] == {"a": 4}
    trajectory.flags = [{"kind": "near_duplicate", "group": 3}]
    trajectory.save(update_fields=["flags"])
    trajectory.save(update_fields=["flags"])  # the same flags again: no second event
    trajectory.flags = [*trajectory.flags, {"kind": "not_executable"}]
    trajectory.save(update_fields=["flags"])
    flagged = [json.loads(d.body)["data"]["flags"] for d in Delivery.objects.filter(event="trajectory.flagged")]
    assert sorted(f[0]["kind"] for f in flagged) == ["near_duplicate", "not_executable"]


def test_task_status_change_iteration_end_and_promotion(hook):
    task = Task.objects.create(instruction="x")
    task.status = Task.Status.COMPLETED
    task.save()
    iteration = Iteration.objects.create(selected_stages=["validate"])
    iteration.status = Iteration.Status.RUNNING
    iteration.save()
    iteration.status = Iteration.Status.SUCCEEDED
    iteration.save(update_fields=["status"])
    model = ModelVersionFactory()
    ModelPromotion.objects.create(action=ModelPromotion.Action.PROMOTE, to_model=model)
    assert _events(hook) == ["iteration.finished", "model.promoted", "task.completed"]
    assert _data(hook, "iteration.finished")["iteration"]["status"] == "succeeded"
    assert _data(hook, "model.promoted")["promotion"]["to_model"] == model.name


def test_only_subscribed_active_webhooks_get_an_event(hook):
    narrow = manage.create("https://example.org/a", [Event.MODEL_PROMOTED], "", by=None)
    paused = manage.set_active(manage.create("https://example.org/b", manage.SUBSCRIBABLE, "", by=None), False)
    emit(Event.TASK_COMPLETED, {"task": {"id": 1}})
    assert _events(hook) == ["task.completed"] and _events(narrow) == [] and _events(paused) == []
    with pytest.raises(ValueError, match="unknown webhook event"):
        emit("task.exploded", {})


def test_redelivery_sends_the_same_data_under_a_new_id(hook):
    first = emit(Event.TASK_COMPLETED, {"task": {"id": 7}})[0]
    again = redeliver(first)
    before, after = json.loads(first.body), json.loads(again.body)
    assert after["data"] == before["data"] and after["id"] != before["id"] == str(first.uuid)
    assert again.status == Delivery.Status.PENDING
