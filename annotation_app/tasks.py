"""Celery tasks of the annotation domain; each is idempotent, as acks_late may run it twice."""

from celery import shared_task

from . import task_queue
from .asr import process_capture  # the asr queue's tasks live beside their routing prefix; import registers them

__all__ = ["process_capture", "propose_live", "release_stale_assignments", "start_capture", "start_live"]


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


# Named under `annotation_app.live.` so CELERY_TASK_ROUTES sends it to the `live` queue: like `start_live` it leases a
# sandbox desktop and waits on the task's setup (I/O-bound, seconds to minutes), which the live workers (threads pool)
# are there for; on the `asr` queue it would wait behind transcriptions while the annotator watches a spinner.
@shared_task(name="annotation_app.live.start_capture")
def start_capture(capture_id: int) -> None:
    """Lease the sandbox desktop of a new browser think-aloud capture and run the task setup (`live` queue)."""
    from .insitu import browser

    browser.start_desktop(capture_id)
