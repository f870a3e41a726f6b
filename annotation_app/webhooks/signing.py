"""Signing and checking webhook bodies: HMAC-SHA256 over "<timestamp>.<body>", so a replayed old body fails.

Receivers check `X-Webhook-Signature: sha256=<hex>` with `verify` (or the three lines it holds) and reject requests
whose `X-Webhook-Timestamp` is older than their tolerance."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Webhook-Signature"
TIMESTAMP_HEADER = "X-Webhook-Timestamp"
EVENT_HEADER = "X-Webhook-Event"
DELIVERY_HEADER = "X-Webhook-Delivery"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Webhook-Signature` value for `body` sent at `timestamp` (Unix seconds)."""
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def headers(secret: str, body: bytes, *, event: str, delivery: str, timestamp: int | None = None) -> dict[str, str]:
    """Every header a delivery carries, signed now (or at `timestamp`)."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        "User-Agent": "gui-agent-annotation-webhooks/1",
        EVENT_HEADER: event,
        DELIVERY_HEADER: delivery,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature(secret, timestamp, body),
    }


def verify(
    secret: str, body: bytes, timestamp: str, received: str, *, tolerance_s: float = 300, now: float | None = None
) -> bool:
    """Whether `received` signs `body` at `timestamp` with `secret`, and `timestamp` is within `tolerance_s` of now."""
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - sent_at) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, sent_at, body), received or "")
