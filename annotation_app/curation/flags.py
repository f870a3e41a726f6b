"""Curation flags on `Trajectory.flags` ([{kind, detail, at, …}]) and what a page shows about a trajectory.

Each curation job owns some kinds and replaces only those, under the trajectory's row lock, with a model save (so
signal receivers such as webhooks' "trajectory.flagged" see the change)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from annotation_app.models import Trajectory

NOT_EXECUTABLE = "not_executable"
DIVERGENT_STEPS = "divergent_steps"
NEAR_DUPLICATE = "near_duplicate"
REPLAY_KINDS = frozenset({NOT_EXECUTABLE, DIVERGENT_STEPS})
KINDS = (NOT_EXECUTABLE, DIVERGENT_STEPS, NEAR_DUPLICATE)
LABELS = {NOT_EXECUTABLE: "not executable", DIVERGENT_STEPS: "divergent steps", NEAR_DUPLICATE: "near duplicate"}


def replace_flags(trajectory_id: int, kinds: frozenset[str] | set[str], new: list[dict[str, Any]]) -> bool:
    """Drop the trajectory's flags of `kinds` and add `new` (each gets `at`); True when the flags changed."""
    return bool(replace_flags_of({trajectory_id: new}, kinds))


def replace_flags_of(new: dict[int, list[dict[str, Any]]], kinds: frozenset[str] | set[str]) -> list[int]:
    """`replace_flags` for several trajectories: their rows locked in one query (in id order, so two jobs never
    deadlock), only the changed ones saved; the ids whose flags changed."""
    changed = []
    with transaction.atomic(savepoint=False):
        now = timezone.now().isoformat()
        for trajectory in Trajectory.objects.select_for_update().filter(pk__in=list(new)).order_by("pk"):
            old = [f for f in trajectory.flags or [] if isinstance(f, dict)]
            before = [f for f in old if f.get("kind") in kinds]
            wanted = new[trajectory.pk]
            if _without_at(before) == _without_at(wanted):
                continue
            trajectory.flags = [f for f in old if f.get("kind") not in kinds] + [{**f, "at": now} for f in wanted]
            trajectory.save(update_fields=["flags"])
            changed.append(trajectory.pk)
    return changed


def _without_at(flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in flag.items() if k != "at"} for flag in flags]


def flag_kinds(trajectory: Trajectory) -> list[str]:
    return [str(f.get("kind")) for f in trajectory.flags or [] if isinstance(f, dict) and f.get("kind")]


def curation_for(trajectory: Trajectory) -> dict[str, Any]:
    """What the review page shows: the flags, the latest verification run (with divergent steps and per-step
    distances by index) and the near-duplicate group's other members. Three small queries."""
    from .models import TrajectorySignature, VerificationRun

    run = VerificationRun.objects.filter(trajectory=trajectory).first()
    flags = [f for f in trajectory.flags or [] if isinstance(f, dict)]
    signature = TrajectorySignature.objects.filter(trajectory=trajectory).select_related("group").first()
    group, others = None, []
    if signature is not None and signature.group is not None:
        group = signature.group
        others = list(
            TrajectorySignature.objects.filter(group=group)
            .exclude(trajectory_id=trajectory.pk)
            .values_list("trajectory_id", flat=True)
            .order_by("trajectory_id")
        )
    distances = {d["index"]: d["distance"] for d in (run.distances if run else [])}
    return {
        "trajectory_id": trajectory.pk,
        "flags": [{**f, "label": LABELS.get(str(f.get("kind")), str(f.get("kind")))} for f in flags],
        "run": run,
        "divergent_steps": list(run.divergent_steps) if run else [],
        "distances": distances,
        "group": group,
        "kept": group.kept_id if group else None,
        "duplicates": others,
    }
