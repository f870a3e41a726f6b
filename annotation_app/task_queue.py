"""The annotators' task queue: hands out the next task atomically and takes tasks back.

Claiming uses `SELECT … FOR UPDATE SKIP LOCKED`, so concurrent annotators never wait on each other and never get
the same task; a partial unique index (one active assignment per task) backs that up in the database.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .models import Assignment, Task, User


class QueueEmpty(Exception):
    """No pending task is left for this annotator; `skipped` pending tasks are left that they skipped."""

    def __init__(self, message: str, skipped: int = 0) -> None:
        super().__init__(message)
        self.skipped = skipped


def current_assignment(annotator: User) -> Assignment | None:
    return (
        Assignment.objects.select_related("task")
        .filter(annotator=annotator, status=Assignment.Status.ACTIVE)
        .order_by("assigned_at")
        .first()
    )


def next_task(annotator: User, *, skip_current: bool = False) -> Assignment:
    """The annotator's active assignment, or a newly claimed one: the most important pending task they never skipped.

    With `skip_current`, the active task goes back to the pool first (it is never offered to them again), in the
    same transaction as the claim. Raises QueueEmpty when nothing is left (a skipped task stays skipped).
    """
    if not skip_current:
        active = current_assignment(annotator)  # the common case, answered without a transaction
        if active is not None:
            return active
    skipped_by_me = Assignment.objects.filter(
        task=OuterRef("pk"), annotator=annotator, status=Assignment.Status.SKIPPED
    )
    with transaction.atomic():
        # Serialise one annotator's own concurrent requests (double clicks) so they hold one task, not two.
        User.objects.select_for_update().filter(pk=annotator.pk).values_list("pk", flat=True).get()
        active = current_assignment(annotator)
        if active is not None and not skip_current:
            return active
        if active is not None:
            _finish(active, Assignment.Status.SKIPPED, Task.Status.PENDING)
        task = (
            Task.objects.select_for_update(skip_locked=True)
            .filter(status=Task.Status.PENDING)
            .exclude(Exists(skipped_by_me))
            .order_by("-importance", "id")
            .first()
        )
        if task is not None:
            task.status = Task.Status.ASSIGNED
            Task.objects.filter(pk=task.pk).update(status=task.status, updated_at=timezone.now())
            return Assignment.objects.create(task=task, annotator=annotator)
    # Outside the transaction: a skip stands even when nothing is left to claim.
    skipped = skipped_pending(annotator)
    if skipped:
        raise QueueEmpty(
            f"Only tasks you skipped are left ({skipped}). Un-skip them to have them handed to you again.", skipped
        )
    raise QueueEmpty("No pending tasks are left in the queue.")


def skipped_pending(annotator: User) -> int:
    """Pending tasks this annotator skipped (the queue never offers them to them again until un-skipped)."""
    return (
        Assignment.objects.filter(
            annotator=annotator, status=Assignment.Status.SKIPPED, task__status=Task.Status.PENDING
        )
        .values("task")
        .distinct()
        .count()
    )


def unskip(annotator: User) -> int:
    """Let the queue offer the annotator the tasks they skipped again; returns how many skips were withdrawn."""
    return Assignment.objects.filter(annotator=annotator, status=Assignment.Status.SKIPPED).update(
        status=Assignment.Status.UNSKIPPED
    )


def _finish(assignment: Assignment, status: str, task_status: str) -> None:
    """End an active assignment and move its task to `task_status` (nothing happens if it already ended)."""
    now = timezone.now()
    with transaction.atomic(savepoint=False):  # inside a caller's transaction, no savepoint round trips
        updated = Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.ACTIVE).update(
            status=status, finished_at=now
        )
        if updated:
            Task.objects.filter(pk=assignment.task_id, status=Task.Status.ASSIGNED).update(
                status=task_status, updated_at=now
            )
    assignment.status, assignment.finished_at = status, now


def skip_current(annotator: User) -> Assignment:
    """Hand the current task back to the pool (it won't come back to this annotator) and claim the next one."""
    return next_task(annotator, skip_current=True)


def complete_assignment(annotator: User, task: Task) -> None:
    """Mark the annotator's active assignment of `task` done (called when they submit a trajectory for it)."""
    active = Assignment.objects.filter(annotator=annotator, task=task, status=Assignment.Status.ACTIVE).first()
    if active is not None:
        _finish(active, Assignment.Status.COMPLETED, Task.Status.COMPLETED)


def release_stale_assignments(older_than: timedelta | None = None) -> int:
    """Expire assignments held longer than the TTL and put their tasks back in the pool. Returns how many."""
    older_than = older_than or timedelta(hours=settings.ASSIGNMENT_TTL_HOURS)
    cutoff = timezone.now() - older_than
    with transaction.atomic():
        stale = list(
            Assignment.objects.select_for_update(skip_locked=True).filter(
                status=Assignment.Status.ACTIVE, assigned_at__lt=cutoff
            )
        )
        for assignment in stale:
            _finish(assignment, Assignment.Status.EXPIRED, Task.Status.PENDING)
    return len(stale)
