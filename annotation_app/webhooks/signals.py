"""Turning model changes into webhook events: each receiver compares a row with what it was before the save, so an
event fires once, on the transition (submitted, completed, finished), whichever code path saved it."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_save, pre_save

from flywheel.models import Iteration, ModelPromotion

from ..models import Review, Task, Trajectory
from .events import emit
from .models import Event

WATCHED = {Trajectory: ("status", "flags"), Task: ("status",), Iteration: ("status",)}


def remember(sender: type, instance: Any, update_fields: Any = None, **_: Any) -> None:
    """Before a save that may change a watched field, keep the row's stored values on the instance."""
    fields = WATCHED[sender]
    instance._webhook_before = None
    if instance.pk is None or (update_fields is not None and not set(fields) & set(update_fields)):
        return
    instance._webhook_before = sender.objects.filter(pk=instance.pk).values(*fields).first()


def _changed(instance: Any, field: str) -> tuple[bool, Any]:
    before = getattr(instance, "_webhook_before", None)
    if before is None:
        return False, None
    return before[field] != getattr(instance, field), before[field]


def trajectory_saved(sender: type, instance: Trajectory, created: bool, **_: Any) -> None:
    changed, old = _changed(instance, "status")
    if (created or changed) and instance.status == Trajectory.Status.SUBMITTED:
        emit(Event.TRAJECTORY_SUBMITTED, {"trajectory": trajectory_data(instance)})
        if created or old == Trajectory.Status.IN_PROGRESS:  # a first submission (not a resubmission)
            # The queue completes the task after this save, with an UPDATE that sends no signal: look once committed.
            transaction.on_commit(lambda: task_completed_by(instance.task_id))
    flags_changed, old_flags = _changed(instance, "flags")
    old_kinds = {flag.get("kind") for flag in old_flags or [] if isinstance(flag, dict)}
    new = [f for f in instance.flags or [] if isinstance(f, dict) and f.get("kind") not in old_kinds]
    if (created or flags_changed) and new:
        emit(Event.TRAJECTORY_FLAGGED, {"trajectory": trajectory_data(instance), "flags": new})


def review_saved(sender: type, instance: Review, created: bool, **_: Any) -> None:
    if created:
        trajectory = instance.trajectory
        emit(
            Event.TRAJECTORY_REVIEWED,
            {
                "trajectory": trajectory_data(trajectory),
                "review": {
                    "id": instance.pk, "verdict": instance.verdict, "score": instance.score, "scores": instance.scores,
                    "comment": instance.comment, "reviewer": instance.reviewer.username,
                },
            },
        )  # fmt: skip


def task_completed_by(task_id: int) -> None:
    """After a first submission: the task.completed event if that submission completed the task (the k-th of k)."""
    task = Task.objects.filter(pk=task_id, status=Task.Status.COMPLETED).first()
    if task is not None:
        task_event(task)


def task_saved(sender: type, instance: Task, created: bool, **_: Any) -> None:
    changed, _old = _changed(instance, "status")
    if changed and instance.status == Task.Status.COMPLETED:
        task_event(instance)


def task_event(instance: Task) -> None:
    """Emit task.completed for `instance`."""
    task = {
        "id": instance.pk, "external_id": instance.external_id, "project": instance.project,
        "domain": instance.domain, "required_annotations": instance.required_annotations,
    }  # fmt: skip
    emit(Event.TASK_COMPLETED, {"task": task})


def iteration_saved(sender: type, instance: Iteration, created: bool, **_: Any) -> None:
    changed, _old = _changed(instance, "status")
    if changed and instance.finished:
        stages = {name: entry.get("status") for name, entry in (instance.stages or {}).items()}
        emit(
            Event.ITERATION_FINISHED,
            {
                "iteration": {
                    "id": instance.pk, "status": instance.status, "error": instance.error, "stages": stages,
                    "base_model": instance.base_model.name if instance.base_model else None,
                    "finished_at": instance.finished_at,
                }
            },
        )  # fmt: skip


def promotion_saved(sender: type, instance: ModelPromotion, created: bool, **_: Any) -> None:
    if created:
        emit(
            Event.MODEL_PROMOTED,
            {
                "promotion": {
                    "id": instance.pk, "action": instance.action, "forced": instance.forced, "reason": instance.reason,
                    "from_model": instance.from_model.name if instance.from_model else None,
                    "to_model": instance.to_model.name if instance.to_model else None,
                    "by": instance.by.username if instance.by else None,
                }
            },
        )  # fmt: skip


def trajectory_data(trajectory: Trajectory) -> dict[str, Any]:
    """What receivers get about a trajectory: ids, mode, status, who, outcome; never its content."""
    return {
        "id": trajectory.pk, "task_id": trajectory.task_id, "mode": trajectory.mode, "status": trajectory.status,
        "annotator": trajectory.annotator.username if trajectory.annotator_id else None,
        "simulated": trajectory.simulated, "outcome_reward": trajectory.outcome_reward,
        "submitted_at": trajectory.submitted_at,
    }  # fmt: skip


def connect() -> None:
    """Wire the receivers (from the app's ready())."""
    for model in WATCHED:
        pre_save.connect(remember, sender=model, dispatch_uid=f"webhooks-remember-{model.__name__}")
    post_save.connect(trajectory_saved, sender=Trajectory, dispatch_uid="webhooks-trajectory")
    post_save.connect(review_saved, sender=Review, dispatch_uid="webhooks-review")
    post_save.connect(task_saved, sender=Task, dispatch_uid="webhooks-task")
    post_save.connect(iteration_saved, sender=Iteration, dispatch_uid="webhooks-iteration")
    post_save.connect(promotion_saved, sender=ModelPromotion, dispatch_uid="webhooks-promotion")
