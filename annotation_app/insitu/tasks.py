"""Celery tasks of the `asr` queue (routed by name): turning think-aloud captures into in-situ trajectories."""

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
    from .insitu.pipeline import mark_failed, process

    try:
        return process(capture_id).status
    except Exception as exc:
        if not isinstance(exc, TRANSIENT) or self.request.retries >= self.max_retries:
            log.exception("capture %s failed", capture_id)
            mark_failed(capture_id, f"Processing failed ({type(exc).__name__}: {exc}). A retry may help.")
        raise
