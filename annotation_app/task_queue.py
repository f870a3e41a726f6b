"""The annotators' task queue: hands out the next task atomically and takes tasks back.

A task asks for k annotations (`Task.required_annotations`): the queue hands it to k different annotators, never to
the same one twice, and the task is completed once k of them have submitted. Claiming uses `SELECT … FOR UPDATE SKIP
LOCKED`, so concurrent annotators never wait on each other; the claim counts the task's holders under that row lock,
so no task ever has more than k, and a partial unique index (one active assignment per task and annotator) backs up
"never the same one twice" in the database.

Task status: `pending` while a slot is open (fewer than k hold or have done it, or a lead requeued it for one more),
`assigned` while every slot is taken and someone still works on it, `completed` once k distinct annotators submitted.
Gold tasks (`Task.is_gold`) are mixed in at the project's gold rate (annotation_app.gold) and stay open to every
annotator (each does one at most once), so the supply of gold never runs out.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from . import gold
from .models import Assignment, Task, User

DONE = (Assignment.Status.SKIPPED, Assignment.Status.COMPLETED)  # the queue never offers such a task to them again


class QueueEmpty(Exception):
    """No pending task is left for this annotator; `skipped` pending tasks are left that they skipped."""

    def __init__(self, message: str, skipped: int = 0) -> None:
        super().__init__(message)
        self.skipped = skipped


def current_assignment(annotator: User) -> Assignment | None:
    """The annotator's active assignment (its task selected too), or None."""
    return (
        Assignment.objects.select_related("task")
        .filter(annotator=annotator, status=Assignment.Status.ACTIVE)
        .order_by("assigned_at")
        .first()
    )


def next_task(annotator: User, *, skip_current: bool = False) -> Assignment:
    """The annotator's active assignment, or a newly claimed one: the most important pending task they never did
    or skipped (a gold one at the project's gold rate).

    With `skip_current`, the active task goes back to the pool first (it is never offered to them again), in the
    same transaction as the claim. Raises QueueEmpty when nothing is left (a skipped task stays skipped).
    """
    if not skip_current:
        active = current_assignment(annotator)  # the common case, answered without a transaction
        if active is not None:
            return active
    with transaction.atomic():
        # Serialise one annotator's own concurrent requests (double clicks) so they hold one task, not two.
        User.objects.select_for_update().filter(pk=annotator.pk).values_list("pk", flat=True).get()
        active = current_assignment(annotator)
        if active is not None and not skip_current:
            return active
        if active is not None:
            _finish(active, Assignment.Status.SKIPPED)
        task = _claim(annotator)
        if task is not None:
            assignment = Assignment.objects.create(task=task, annotator=annotator)
            _settle(task, "claimed")
            return assignment
    # Outside the transaction: a skip stands even when nothing is left to claim.
    skipped = skipped_pending(annotator)
    if skipped:
        raise QueueEmpty(
            f"Only tasks you skipped are left ({skipped}). Un-skip them to have them handed to you again.", skipped
        )
    raise QueueEmpty("No pending tasks are left in the queue.")


def _claim(annotator: User) -> Task | None:
    """Lock (SKIP LOCKED) the pending task to hand out next: gold or not by the annotator's draw, else any."""
    done_by_me = Assignment.objects.filter(task=OuterRef("pk"), annotator=annotator, status__in=DONE)
    open_tasks = (
        Task.objects.select_for_update(skip_locked=True)
        .filter(status=Task.Status.PENDING)
        .exclude(Exists(done_by_me))
        .order_by("-importance", "id")
    )
    handed_out = Assignment.objects.filter(annotator=annotator).count()
    wanted = gold.gold_filter(gold.draw(annotator.pk, handed_out))
    for kind in (wanted if wanted is not None else Q(is_gold=False), Q()):
        task = open_tasks.filter(kind).first()
        if task is not None:
            return task
    return None


def _settle(task: Task, event: str) -> None:
    """Move the (locked) task's status after one of its assignments was `claimed`, `released` or `completed`.

    A release only reopens a full task; only a completion completes one, so a task a lead requeued for one more
    annotator (pending while k have done it) stays open when that annotator skips."""
    if task.status not in (Task.Status.PENDING, Task.Status.ASSIGNED) or task.is_gold:
        return
    k = max(task.required_annotations, 1)
    if event == "released":
        status = Task.Status.PENDING
    else:
        active, completed = _counts(task)
        if event == "claimed":
            status = Task.Status.ASSIGNED if active + completed >= k else Task.Status.PENDING
        elif not active:  # completed, and nobody else still works on it
            status = Task.Status.COMPLETED if completed >= k else Task.Status.PENDING
        else:
            status = task.status
    if status != task.status:
        task.status = status
        Task.objects.filter(pk=task.pk).update(status=status, updated_at=timezone.now())


def _counts(task: Task) -> tuple[int, int]:
    """(active holders, distinct annotators who completed it) of a task, in one query."""
    counts = Assignment.objects.filter(task=task).aggregate(
        active=Count("pk", filter=Q(status=Assignment.Status.ACTIVE)),
        completed=Count("annotator", distinct=True, filter=Q(status=Assignment.Status.COMPLETED)),
    )
    return counts["active"], counts["completed"]


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


def _finish(assignment: Assignment, status: str) -> bool:
    """End an active assignment as `status` and settle its task (nothing happens if it already ended).

    The task row is locked first (then the assignment is changed), the order every path here takes, so two
    annotators finishing the same task one after the other count each other's completion."""
    now = timezone.now()
    with transaction.atomic(savepoint=False):  # inside a caller's transaction, no savepoint round trips
        task = Task.objects.select_for_update().get(pk=assignment.task_id)
        updated = Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.ACTIVE).update(
            status=status, finished_at=now
        )
        if updated:
            _settle(task, "completed" if status == Assignment.Status.COMPLETED else "released")
    assignment.status, assignment.finished_at = status, now
    return bool(updated)


def skip_current(annotator: User) -> Assignment:
    """Hand the current task back to the pool (it won't come back to this annotator) and claim the next one."""
    return next_task(annotator, skip_current=True)


def complete_assignment(annotator: User, task: Task) -> None:
    """Mark the annotator's active assignment of `task` done (called when they submit a trajectory for it); the
    task is completed once k different annotators have."""
    active = Assignment.objects.filter(annotator=annotator, task=task, status=Assignment.Status.ACTIVE).first()
    if active is not None:
        _finish(active, Assignment.Status.COMPLETED)


def settle_task(task: Task) -> Task:
    """Re-derive a task's status from its assignments after a lead changed its k or gold flag (gold.set_overlap):
    completed once k distinct annotators submitted, assigned while every slot is held, pending otherwise; gold tasks
    stay pending. Archived tasks stay archived."""
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.status == Task.Status.ARCHIVED:
            return locked
        active, completed = _counts(locked)
        k = max(locked.required_annotations, 1)
        if locked.is_gold:
            status = Task.Status.PENDING
        elif completed >= k and not active:
            status = Task.Status.COMPLETED
        elif active and active + completed >= k:
            status = Task.Status.ASSIGNED
        else:
            status = Task.Status.PENDING
        if status != locked.status:
            locked.status = status
            Task.objects.filter(pk=locked.pk).update(status=status, updated_at=timezone.now())
    return locked


def open_slots(task: Task) -> int:
    """How many more annotators the task wants now (k minus those holding or done); gold tasks never fill."""
    holds = task.assignments.filter(status__in=(Assignment.Status.ACTIVE, Assignment.Status.COMPLETED))
    return max(task.required_annotations - holds.values("annotator").distinct().count(), 0)


def release_stale_assignments(older_than: timedelta | None = None) -> int:
    """Expire assignments held longer than the TTL and put their tasks back in the pool. Returns how many."""
    older_than = older_than or timedelta(hours=settings.ASSIGNMENT_TTL_HOURS)
    cutoff = timezone.now() - older_than
    stale = list(Assignment.objects.filter(status=Assignment.Status.ACTIVE, assigned_at__lt=cutoff))
    released = 0
    for assignment in stale:  # one short transaction each, task row first (as everywhere): no lock-order cycle
        with transaction.atomic():
            released += _finish(assignment, Assignment.Status.EXPIRED)
    return released


def set_overlap(task: Task, *, required_annotations: object, is_gold: bool) -> Task:
    """A lead sets how many annotators must each do the task (k) and whether it is gold; the status follows.
    (Here, not in annotation_app.gold, which the queue imports: the two modules would import each other.)"""
    try:
        k = int(str(required_annotations).strip())
    except ValueError:
        raise gold.OverlapRefused("The number of annotations (k) must be a whole number.") from None
    if not 1 <= k <= gold.MAX_REQUIRED_ANNOTATIONS:
        raise gold.OverlapRefused(
            f"The number of annotations (k) must be between 1 and {gold.MAX_REQUIRED_ANNOTATIONS}."
        )
    if is_gold and not task.evaluator:
        raise gold.OverlapRefused("A gold task needs an evaluator: its accuracy is the verifier's outcome.")
    Task.objects.filter(pk=task.pk).update(required_annotations=k, is_gold=is_gold)
    return settle_task(task)
