"""Celery tasks of live annotation (`live` queue, routed by the `annotation_app.live.` name prefix); idempotent, as
acks_late may run them twice."""

from celery import shared_task

from . import sessions


@shared_task(name="annotation_app.live.start")
def start_live(live_id: int) -> None:
    """Lease the sandbox of a new live session, run the task setup and request the first proposals."""
    sessions.start(live_id)


@shared_task(name="annotation_app.live.propose")
def propose_live(live_id: int, index: int) -> None:
    """Ask the model for step `index`'s candidates and push them to the page; a stale index is a no-op."""
    sessions.propose(live_id, index)
