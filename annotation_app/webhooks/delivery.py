"""Sending one delivery: POST the signed body, record the answer, and say when to try again (exponential backoff)."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .models import Delivery
from .signing import headers

RESPONSE_KEPT = 2000  # characters of the receiver's answer kept in the log


def backoff_s(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based): base x 4^(attempt-1), capped at 6 hours."""
    return min(settings.WEBHOOK_RETRY_BASE_S * 4 ** (attempt - 1), 6 * 3600)


def claim(delivery_id: int) -> Delivery | None:
    """The delivery if it still needs sending; None when it was delivered or given up (a task run twice is a no-op)."""
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(skip_locked=True)
            .select_related("webhook")
            .filter(pk=delivery_id, status__in=[Delivery.Status.PENDING, Delivery.Status.RETRYING])
            # A message that came early (Redis redelivers countdowns past its visibility timeout) waits its turn.
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=timezone.now() + timedelta(seconds=1)))
            .first()
        )
        if delivery is None:
            return None
        delivery.attempts += 1
        delivery.last_attempt_at = timezone.now()
        delivery.save(update_fields=["attempts", "last_attempt_at"])
        return delivery


def attempt(delivery_id: int) -> float | None:
    """Make one attempt at a delivery; the seconds until the next attempt, or None when there is none to make."""
    delivery = claim(delivery_id)
    if delivery is None:
        return None
    body = delivery.body.encode()
    signed = headers(delivery.webhook.secret, body, event=delivery.event, delivery=str(delivery.uuid))
    started = time.monotonic()
    status, answer, error = None, "", ""
    try:
        response = httpx.post(delivery.webhook.url, content=body, headers=signed, timeout=settings.WEBHOOK_TIMEOUT_S)
        status, answer = response.status_code, response.text[:RESPONSE_KEPT]
        if not 200 <= status < 300:
            error = f"the receiver answered {status}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}" or type(exc).__name__
    delivery.duration_ms = int((time.monotonic() - started) * 1000)
    delivery.response_status, delivery.response_body, delivery.error = status, answer, error
    wait = None
    if not error:
        delivery.status, delivery.delivered_at, delivery.next_attempt_at = (
            Delivery.Status.SUCCEEDED,
            timezone.now(),
            None,
        )
    elif delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        delivery.status, delivery.next_attempt_at = Delivery.Status.FAILED, None
    else:
        wait = backoff_s(delivery.attempts)
        delivery.status, delivery.next_attempt_at = Delivery.Status.RETRYING, timezone.now() + timedelta(seconds=wait)
    delivery.save(
        update_fields=[
            "status", "response_status", "response_body", "error", "duration_ms", "delivered_at", "next_attempt_at",
        ]
    )  # fmt: skip
    return wait
