"""Emitting platform events: one Delivery row per subscribed webhook, written in the caller's transaction (so an
event exists exactly when the change that caused it was committed), sent by Celery once that transaction commits."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from ..queues import enqueue
from .models import Delivery, Event, Webhook

DELIVER = "annotation_app.webhooks.deliver"


def body_of(event: str, data: dict[str, Any], delivery: uuid.UUID) -> str:
    """The JSON every receiver gets: {id, event, created_at, data}."""
    envelope = {"id": str(delivery), "event": event, "created_at": timezone.now().isoformat(), "data": data}
    return json.dumps(envelope, cls=DjangoJSONEncoder, separators=(",", ":"), sort_keys=True)


def subscribers(event: str) -> list[Webhook]:
    """Active webhooks that receive `event`."""
    return [hook for hook in Webhook.objects.filter(active=True) if event in hook.events]


def emit(event: str, data: dict[str, Any], *, webhooks: list[Webhook] | None = None) -> list[Delivery]:
    """Record `event` for each subscriber (or for `webhooks`) and send them after the current transaction commits."""
    if event not in Event.values:
        raise ValueError(f"unknown webhook event {event!r}")
    deliveries = []
    for hook in subscribers(event) if webhooks is None else webhooks:
        key = uuid.uuid4()
        deliveries.append(
            Delivery(
                uuid=key, webhook=hook, event=event, body=body_of(event, data, key), next_attempt_at=timezone.now()
            )
        )
    if deliveries:
        Delivery.objects.bulk_create(deliveries)
        ids = [delivery.pk for delivery in deliveries]
        transaction.on_commit(lambda: [enqueue(DELIVER, pk) for pk in ids])
    return deliveries


def redeliver(delivery: Delivery) -> Delivery:
    """Send a delivery's same body again as a new delivery (a failed one, or to replay it to a fixed receiver)."""
    key = uuid.uuid4()
    envelope = json.loads(delivery.body)
    envelope["id"] = str(key)
    body = json.dumps(envelope, separators=(",", ":"), sort_keys=True)
    again = Delivery.objects.create(
        uuid=key, webhook=delivery.webhook, event=delivery.event, body=body, next_attempt_at=timezone.now()
    )
    transaction.on_commit(lambda: enqueue(DELIVER, again.pk))
    return again
