"""Celery tasks of the annotation domain; each is idempotent, as acks_late may run it twice.

Celery's autodiscovery imports this module: it registers the tasks of the domain's packages (live/, insitu/) too.
Domain code enqueues by name through annotation_app.queues, never by importing a task module."""

from celery import shared_task

from . import task_queue
from .insitu.tasks import process_capture, start_capture
from .live.tasks import propose_live, start_live

__all__ = ["process_capture", "propose_live", "release_stale_assignments", "start_capture", "start_live"]


@shared_task
def release_stale_assignments() -> int:
    """Periodic (beat): give tasks held past ASSIGNMENT_TTL_HOURS back to the pool."""
    return task_queue.release_stale_assignments()
