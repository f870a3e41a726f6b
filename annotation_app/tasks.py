"""Celery tasks of the annotation domain (default queue); each is idempotent, as acks_late may run it twice."""

from celery import shared_task

from . import task_queue


@shared_task
def release_stale_assignments() -> int:
    """Periodic (beat): give tasks held past ASSIGNMENT_TTL_HOURS back to the pool."""
    return task_queue.release_stale_assignments()
