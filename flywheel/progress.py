"""What every stage shares: the cancel and refusal exceptions, an iteration's state as pages see it, the push to
their websocket, and recording progress within a stage (which is also where a cancel is noticed). A module of its
own so the stage modules (training_stages, rft) and the runner (iterations) import it without importing each other."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.db import connection
from django.utils import timezone

from annotation_app.consumers import notify_role
from annotation_app.models import Role

from .models import Iteration

log = logging.getLogger(__name__)

EVENT = "flywheel_iteration"


class Cancelled(Exception):
    """The iteration was cancelled while a stage ran."""


class IterationError(ValueError):
    """A request to start or cancel that cannot be honoured; the message says why (a 400 or 409 to callers)."""


def state_of(iteration: Iteration) -> dict[str, Any]:
    """What the pages and the websocket show of an iteration."""
    return {
        "id": iteration.pk,
        "status": iteration.status,
        "current_stage": iteration.current_stage,
        "stages": iteration.stages,
        "cancel_requested": iteration.cancel_requested,
        "error": iteration.error,
    }


def push(iteration: Iteration) -> None:
    """Tell the open flywheel pages (ML engineers and data leads) that this iteration changed."""
    state = state_of(iteration)
    for role in (Role.ML_ENGINEER, Role.DATA_LEAD):
        try:
            notify_role(role, EVENT, iteration=state)
        except Exception:  # a push is a courtesy: pages also poll, the row is the truth
            log.warning("could not push iteration %s", iteration.pk, exc_info=True)


def progress(iteration: Iteration, stage: str, done: int, total: int | None) -> None:
    """Record progress within a stage, push it (at most every PUSH_EVERY_S, and at the end), and stop when a cancel
    was asked for (one UPDATE … RETURNING)."""
    entry = iteration.stages[stage]
    entry["done"], entry["total"], entry["heartbeat"] = done, total, timezone.now().isoformat()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Iteration._meta.db_table} SET stages = %s::jsonb WHERE id = %s RETURNING cancel_requested",
            [as_json(iteration.stages), iteration.pk],
        )
        row = cursor.fetchone()
    now = time.monotonic()
    if done == total or now - _last_push.get(iteration.pk, 0.0) >= PUSH_EVERY_S:
        _last_push[iteration.pk] = now
        push(iteration)
    if row and row[0]:
        iteration.cancel_requested = True
        raise Cancelled


PUSH_EVERY_S = 0.5
_last_push: dict[int, float] = {}


def as_json(value: Any) -> str:
    return json.dumps(value, default=str)
