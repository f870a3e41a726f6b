"""Celery tasks of think-aloud capture: processing a capture into an in-situ trajectory (`asr` queue, by the
`annotation_app.asr.` name prefix) and starting a browser capture's desktop (`live` queue)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError

log = logging.getLogger(__name__)


TRANSIENT = (OperationalError, OSError)


@shared_task(
    bind=True,
    name="annotation_app.asr.process_capture",
    acks_late=True,
    autoretry_for=TRANSIENT,
    retry_backoff=5,
    max_retries=3,
)
def process_capture(self, capture_id: int) -> str:  # type: ignore[no-untyped-def]
    """Unpack, transcribe, reduce and align one capture (idempotent: a processed capture is left as it is).

    Database and file-system hiccups are retried; anything else, or the last retry, marks the capture failed with
    the reason, so the page never shows "processing" forever."""
    from .pipeline import mark_failed, process

    try:
        return process(capture_id).status
    except Exception as exc:
        if not isinstance(exc, TRANSIENT) or self.request.retries >= self.max_retries:
            log.exception("capture %s failed", capture_id)
            mark_failed(capture_id, f"Processing failed ({type(exc).__name__}: {exc}). A retry may help.")
        raise


# Named under `annotation_app.live.` so CELERY_TASK_ROUTES sends it to the `live` queue: like live annotation's start it
# leases a sandbox desktop and waits on the task's setup (I/O-bound, seconds to minutes), which the live workers
# (threads pool) are there for; on the `asr` queue it would wait behind transcriptions while the annotator watches a
# spinner.
@shared_task(name="annotation_app.live.start_capture")
def start_capture(capture_id: int) -> None:
    """Lease the sandbox desktop of a new browser think-aloud capture and run the task setup (`live` queue)."""
    from .browser import start_desktop

    start_desktop(capture_id)
