"""Celery tasks of the webhooks app (on the `default` queue): deliver one event, and re-send any overdue retry."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from . import delivery
from .models import Delivery


@shared_task(name="annotation_app.webhooks.deliver")
def deliver(delivery_id: int) -> str:
    """One attempt; a failed one schedules the next with its backoff as a countdown."""
    wait = delivery.attempt(delivery_id)
    if wait is not None:
        deliver.apply_async((delivery_id,), countdown=wait)
    return "retry" if wait is not None else "done"


@shared_task(name="annotation_app.webhooks.resend_overdue")
def resend_overdue() -> int:
    """Periodic (beat): re-send retries whose countdown message was lost (a worker killed with it reserved)."""
    overdue = Delivery.objects.filter(
        status__in=[Delivery.Status.PENDING, Delivery.Status.RETRYING],
        next_attempt_at__lt=timezone.now() - timedelta(minutes=5),
    ).values_list("pk", flat=True)[:500]
    for pk in overdue:
        deliver.delay(pk)
    return len(overdue)
