"""Celery task that recomputes the quality aggregates: run by beat (QUALITY_REFRESH_S) and by the dashboard's button."""

from __future__ import annotations

from celery import shared_task

from . import aggregates


@shared_task(name="annotation_app.quality.refresh")
def refresh(trigger: str = "beat") -> dict:
    """Recompute the aggregates on the default queue; idempotent, and skipped while another refresh runs."""
    done = aggregates.refresh(trigger)
    if done is None:
        return {"skipped": "another refresh is running"}
    return {"refresh": done.pk, "duration_ms": done.duration_ms}
