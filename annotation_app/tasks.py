"""Celery tasks of the annotation domain; each is idempotent, as acks_late may run it twice."""

from celery import shared_task

from . import task_queue
from .asr import process_capture  # the asr queue's tasks live beside their routing prefix; import registers them

__all__ = ["process_capture", "propose_live", "release_stale_assignments", "start_live"]


@shared_task
def release_stale_assignments() -> int:
    """Periodic (beat): give tasks held past ASSIGNMENT_TTL_HOURS back to the pool."""
    return task_queue.release_stale_assignments()


@shared_task(name="annotation_app.live.start")
def start_live(live_id: int) -> None:
    """Lease the sandbox of a new live session, run the task setup and request the first proposals (`live` queue)."""
    from . import live

    live.start(live_id)


@shared_task(name="annotation_app.live.propose")
def propose_live(live_id: int, index: int) -> None:
    """Ask the model for step `index`'s candidates and push them to the page; a stale index is a no-op."""
    from . import live

    live.propose(live_id, index)
