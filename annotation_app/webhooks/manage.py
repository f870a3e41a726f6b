"""Adding, changing and testing webhooks: the checks a page or the API applies before anything is stored."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from .events import emit
from .models import Delivery, Event, Webhook, new_secret

SUBSCRIBABLE = [event for event in Event.values if event != Event.PING]


class WebhookRefused(ValueError):
    """A webhook change that cannot be made; the message says why, for the page."""


def clean(url: str, events: list[str], description: str = "") -> tuple[str, list[str], str]:
    """The URL, events and description checked: an http(s) URL with a host, at least one known event."""
    url = (url or "").strip()
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise WebhookRefused(f"'{url[:200]}' is not an http:// or https:// URL.") from None
    if not urlsplit(url).hostname:
        raise WebhookRefused("The URL needs a host name.")
    unknown = sorted(set(events) - set(SUBSCRIBABLE))
    if unknown:
        raise WebhookRefused(f"Unknown event(s): {', '.join(unknown)}. Known: {', '.join(SUBSCRIBABLE)}.")
    if not events:
        raise WebhookRefused("Choose at least one event.")
    if len(description) > 200:
        raise WebhookRefused("The description is longer than 200 characters.")
    return url, [e for e in SUBSCRIBABLE if e in events], description.strip()


def create(url: str, events: list[str], description: str, *, by: Any) -> Webhook:
    """A new active webhook with a fresh secret."""
    url, events, description = clean(url, events, description)
    return Webhook.objects.create(url=url, events=events, description=description, created_by=by)


def update(webhook: Webhook, url: str, events: list[str], description: str) -> Webhook:
    """Change where a webhook sends and what; its secret and log stay."""
    webhook.url, webhook.events, webhook.description = clean(url, events, description)
    webhook.save(update_fields=["url", "events", "description"])
    return webhook


def set_active(webhook: Webhook, active: bool) -> Webhook:
    webhook.active = active
    webhook.save(update_fields=["active"])
    return webhook


def rotate_secret(webhook: Webhook) -> Webhook:
    """A new signing secret; deliveries from now on are signed with it."""
    webhook.secret = new_secret()
    webhook.save(update_fields=["secret"])
    return webhook


def ping(webhook: Webhook, *, by: Any) -> Delivery:
    """Send a `ping` event to this webhook only, to test its receiver."""
    return emit(Event.PING, {"webhook": webhook.pk, "by": getattr(by, "username", None)}, webhooks=[webhook])[0]
