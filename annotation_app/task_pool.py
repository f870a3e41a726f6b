"""The data lead's task pool: its counts by status, and the changes to its tasks (edit, archive, requeue), each one
function that writes and notifies."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from .consumers import notify_role
from .models import Assignment, Role, Task

EDITABLE = ("instruction", "domain", "difficulty", "importance")


def status_counts() -> list[tuple[str, int]]:
    """(status label, number of tasks) for every status, in the statuses' order: the pool page's count boxes."""
    counts = dict(Task.objects.values_list("status").annotate(n=Count("id")).order_by())
    return [(label, counts.get(value, 0)) for value, label in Task.Status.choices]


class TaskChangeRefused(ValueError):
    """The change cannot be made (the message says why, for the lead)."""


def _expire_active(task: Task) -> int:
    """End the task's active assignment, if any: its annotator no longer holds it."""
    return Assignment.objects.filter(task=task, status=Assignment.Status.ACTIVE).update(
        status=Assignment.Status.EXPIRED, finished_at=timezone.now()
    )


def _changed(task: Task) -> None:
    transaction.on_commit(lambda: notify_role(Role.DATA_LEAD, "tasks_changed", task=task.pk))


def edit_task(task: Task, fields: dict[str, Any]) -> Task:
    """Change the task's instruction, domain, difficulty (1-5) or importance; other fields are refused."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise TaskChangeRefused(f"These fields cannot be edited here: {', '.join(sorted(unknown))}.")
    instruction = str(fields.get("instruction", task.instruction)).strip()
    if not instruction:
        raise TaskChangeRefused("The instruction cannot be empty.")
    try:
        difficulty = int(fields.get("difficulty", task.difficulty))
        importance = int(fields.get("importance", task.importance))
    except (TypeError, ValueError):
        raise TaskChangeRefused("Difficulty and importance must be whole numbers.") from None
    if not 1 <= difficulty <= 5:
        raise TaskChangeRefused("Difficulty must be between 1 and 5.")
    if not -32768 <= importance <= 32767:
        raise TaskChangeRefused("Importance must be between -32768 and 32767.")
    domain = str(fields.get("domain", task.domain)).strip()
    if len(domain) > 100:
        raise TaskChangeRefused("The domain is at most 100 characters.")
    with transaction.atomic():
        task.instruction, task.domain, task.difficulty, task.importance = instruction, domain, difficulty, importance
        task.save(update_fields=[*EDITABLE, "updated_at"])
        _changed(task)
    return task


def _move(task: Task, status: str, refusal: str) -> Task:
    """Set the task's status, ending whoever holds it; refused (with `refusal`) when it has that status already."""
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.status == status:
            raise TaskChangeRefused(refusal)
        _expire_active(locked)
        locked.status = status
        locked.save(update_fields=["status", "updated_at"])
        _changed(locked)
    return locked


def archive_task(task: Task) -> Task:
    """Take the task out of the pool: nobody is handed it again, and whoever holds it now no longer does."""
    return _move(task, Task.Status.ARCHIVED, "The task is already archived.")


def requeue_task(task: Task) -> Task:
    """Put the task back in the pool as pending (an archived or completed task, or one an annotator holds)."""
    return _move(task, Task.Status.PENDING, "The task is already pending in the pool.")
