"""Adjudication of a task's disagreeing annotations: the k trajectories side by side, step-aligned with a diff of
their actions, and the lead's decision (annotation_app.models.Adjudication).

Decision: the chosen trajectory stands and keeps its status (its review is still the review queue's business); every
other finished annotation of the task becomes rejected, with `metadata.adjudicated_out` saying by which adjudication
and what its status was, so exports and the flywheel's validation (which read the status) keep only the one that
stands. "Neither" rejects them all. A later adjudication of the same task replaces the earlier: trajectories it had
rejected get their earlier status back unless they lose again.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db import transaction
from django.utils import timezone

from .agreement import FINISHED, action_token
from .models import Adjudication, Task, Trajectory, User

MAX_NOTE = 2000


class AdjudicationRefused(ValueError):
    """The decision cannot be recorded (the message says why, for the lead)."""


def candidates(task: Task) -> list[Trajectory]:
    """The task's annotations to compare: each annotator's latest finished trajectory, by annotator."""
    rows = (
        Trajectory.objects.filter(task=task, annotator__isnull=False, status__in=FINISHED)
        .exclude(mode=Trajectory.Mode.ROLLOUT)
        .select_related("annotator")
        .order_by("annotator_id", "-id")
    )
    latest: dict[int, Trajectory] = {}
    for trajectory in rows:
        latest.setdefault(trajectory.annotator_id, trajectory)  # type: ignore[arg-type]
    return list(latest.values())


def side_by_side(trajectories: list[Trajectory]) -> list[dict[str, Any]]:
    """Rows by step index, one cell per trajectory (None past its end); a cell `differs` when its action (type and
    target) is not the one most trajectories took at that index, and a row is `same` when all took one action."""
    steps = {
        t.pk: list(t.steps.order_by("index").only("id", "index", "thought", "action_text", "action", "status"))
        for t in trajectories
    }
    length = max((len(s) for s in steps.values()), default=0)
    rows = []
    for i in range(length):
        cells = []
        for t in trajectories:
            step = steps[t.pk][i] if i < len(steps[t.pk]) else None
            token = None
            if step is not None:
                actions = (step.action or {}).get("actions", [])
                token = tuple(action_token(a, t.screen_width, t.screen_height) for a in actions)
            cells.append({"trajectory": t, "step": step, "token": token})
        counts = Counter(c["token"] for c in cells)
        majority, _ = counts.most_common(1)[0]
        for cell in cells:
            cell["differs"] = len(counts) > 1 and (cell["token"] != majority or counts[majority] * 2 <= len(cells))
        rows.append({"index": i, "cells": cells, "same": len(counts) == 1})
    return rows


def adjudicate(task: Task, lead: User, chosen: str, note: str = "") -> Adjudication:
    """Record the lead's decision: `chosen` is a trajectory id among the task's candidates, or "neither"."""
    note = note.strip()
    if len(note) > MAX_NOTE:
        raise AdjudicationRefused(f"The note is at most {MAX_NOTE:,} characters.")
    with transaction.atomic():
        Task.objects.select_for_update().filter(pk=task.pk).values_list("pk", flat=True).get()
        found = {t.pk: t for t in candidates(task)}
        if len(found) < 2:
            raise AdjudicationRefused("Fewer than two annotators finished this task: there is nothing to adjudicate.")
        winner: Trajectory | None = None
        if chosen != "neither":
            if not chosen.strip().isdigit() or int(chosen) not in found:
                raise AdjudicationRefused(
                    f"Choose one of the trajectories {', '.join(f'#{pk}' for pk in sorted(found))}, or neither."
                )
            winner = found[int(chosen)]
        decision = Adjudication.objects.create(task=task, lead=lead, chosen=winner, note=note)
        now = timezone.now().isoformat()
        for trajectory in Trajectory.objects.select_for_update().filter(pk__in=list(found)):
            out = trajectory.metadata.get("adjudicated_out")
            if winner is not None and trajectory.pk == winner.pk:
                if out:  # an earlier adjudication had rejected it: it stands now
                    trajectory.status = out.get("previous_status", Trajectory.Status.SUBMITTED)
                    trajectory.metadata.pop("adjudicated_out")
                    trajectory.save(update_fields=["status", "metadata", "updated_at"])
                continue
            previous = out.get("previous_status") if out else trajectory.status
            trajectory.metadata["adjudicated_out"] = {
                "adjudication": decision.pk,
                "previous_status": previous,
                "chosen": winner.pk if winner else None,
                "at": now,
            }
            trajectory.status = Trajectory.Status.REJECTED
            trajectory.save(update_fields=["status", "metadata", "updated_at"])
    return decision


def latest_decision(task: Task) -> Adjudication | None:
    """The task's standing adjudication (the latest), or None."""
    return task.adjudications.select_related("lead", "chosen").first()
