"""Near-duplicate trajectories across the whole store (UI-TARS-2 §2.4.1): same task, same action sequence (types and
their text/keys/direction equal, points within a tolerance) and the same screens by perceptual hash, step by step.

Each finished trajectory gets a TrajectorySignature; candidates are the signatures with the same (task, action_key),
one index lookup, so a new trajectory costs O(its bucket), never a scan of the store. Matches join (and merge) groups;
each group keeps one trajectory (approved first, then the best outcome, then the oldest) and every member carries a
`near_duplicate` flag {group, keep, of}. The incremental pass (`dedup_pending`, beat and `manage.py curate dedup`)
signs trajectories that have no signature yet; `dedup_store` also re-signs those whose steps changed since."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, IntegerField, Value, When

from annotation_app.models import Step, Trajectory
from sandbox.actions import ActionSyntaxError, Point, action_to_dict, parse_actions

from . import hashing
from .flags import NEAR_DUPLICATE, replace_flags, replace_flags_of
from .models import DuplicateGroup, TrajectorySignature

log = logging.getLogger(__name__)

DEDUP_TASK = "annotation_app.curation.dedup"  # annotation_app.curation.tasks (default queue)
HASH_BITS = 6  # pHash bits (of 64) within which two screenshots count as the same screen
POINT_TOLERANCE = 0.02  # points within 2 % of the screen's width/height count as the same target
LOCK_NAMESPACE = 0x6375  # pg_advisory_xact_lock(namespace, task id): one dedup per task at a time
FINISHED = (Trajectory.Status.SUBMITTED, Trajectory.Status.APPROVED, Trajectory.Status.REJECTED)
POINT_FIELDS = ("point", "start", "end")


def _steps(trajectory: Trajectory) -> list[Step]:
    return list(trajectory.steps.exclude(status=Step.Status.CUT).order_by("index"))


def digest_of(steps: list[Step]) -> str:
    """What a signature was computed from: the steps' actions and screenshot checksums."""
    text = "\x00".join(f"{s.index}\x01{s.action_text}\x01{s.screenshot_sha256}\x01{bool(s.screenshot)}" for s in steps)
    return hashlib.sha256(text.encode()).hexdigest()


def skeleton(action_text: str, width: int, height: int) -> tuple[list[dict[str, Any]], list[list[float]]]:
    """A step's actions without their points (compared exactly) and its points as fractions of the screen."""
    try:
        actions = parse_actions(action_text)
    except ActionSyntaxError:
        return [{"unparsed": action_text}], []
    shapes, points = [], []
    for action in actions:
        data = action_to_dict(action)
        for name in POINT_FIELDS:
            point = getattr(action, name, None)
            if isinstance(point, Point):
                points.append([round(point.x / width, 4), round(point.y / height, 4)])
                data.pop(name, None)
        shapes.append(data)
    return shapes, points


def signature_fields(trajectory: Trajectory, steps: list[Step]) -> dict[str, Any]:
    """The signature's columns for these steps (reads each screenshot once, to hash it)."""
    width, height = max(trajectory.screen_width, 1), max(trajectory.screen_height, 1)
    shapes, points, hashes = [], [], []
    for step in steps:
        shape, pts = skeleton(step.action_text, width, height)
        shapes.append(shape)
        points.append(pts)
        hashes.append(_hash(step))
    key = hashlib.sha256(json.dumps(shapes, sort_keys=True).encode()).hexdigest()
    return {"action_key": key, "points": points, "hashes": hashes, "digest": digest_of(steps)}


def _hash(step: Step) -> str:
    if not step.screenshot:
        return ""
    try:
        with step.screenshot.open("rb") as f:
            return hashing.phash(f.read())
    except (OSError, ValueError) as exc:
        log.info("step %s of trajectory %s: no hash (%s)", step.index, step.trajectory_id, exc)
        return ""


def near(a: TrajectorySignature, b: TrajectorySignature) -> bool:
    """Same action skeleton (the caller's lookup), points within tolerance and every screen within HASH_BITS; a step
    without a screenshot on either side makes no duplicate (it cannot be told)."""
    bits = int(getattr(settings, "CURATION_DUPLICATE_BITS", HASH_BITS))
    if a.action_key != b.action_key or len(a.hashes) != len(b.hashes) or len(a.points) != len(b.points):
        return False
    for pa, pb in zip(a.points, b.points, strict=True):
        if len(pa) != len(pb):
            return False
        for (xa, ya), (xb, yb) in zip(pa, pb, strict=True):
            if abs(xa - xb) > POINT_TOLERANCE or abs(ya - yb) > POINT_TOLERANCE:
                return False
    for ha, hb in zip(a.hashes, b.hashes, strict=True):
        if not ha or not hb or hashing.distance(ha, hb) > bits:
            return False
    return True


def dedup_trajectory(trajectory_id: int, *, resign: bool = False) -> int | None:
    """Sign the trajectory (again, if its steps changed or `resign`), join it to its near duplicates' group and
    refresh the flags of every group touched; its group id, or None."""
    trajectory = Trajectory.objects.filter(pk=trajectory_id).first()
    if trajectory is None:
        return None
    steps = _steps(trajectory)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, trajectory.task_id])
        sig = TrajectorySignature.objects.filter(trajectory_id=trajectory_id).first()
        old_group = sig.group_id if sig else None
        if trajectory.status not in FINISHED or not steps:
            if sig is not None:
                sig.delete()
                _refresh(old_group)
                replace_flags(trajectory_id, {NEAR_DUPLICATE}, [])
            return None
        if sig is None or resign or sig.digest != digest_of(steps):
            fields = signature_fields(trajectory, steps)
            if sig is None:
                sig = TrajectorySignature.objects.create(trajectory=trajectory, task_id=trajectory.task_id, **fields)
            else:
                for name, value in {"task_id": trajectory.task_id, **fields}.items():
                    setattr(sig, name, value)
                sig.save(update_fields=["task", *fields, "computed_at"])
        candidates = TrajectorySignature.objects.filter(task_id=trajectory.task_id, action_key=sig.action_key).exclude(
            trajectory_id=trajectory_id
        )
        matches = [c for c in candidates if near(sig, c)]
        if not matches:
            if old_group is not None:
                TrajectorySignature.objects.filter(pk=sig.pk).update(group=None)
                _refresh(old_group)
                replace_flags(trajectory_id, {NEAR_DUPLICATE}, [])
            return None
        groups = sorted({c.group_id for c in matches if c.group_id is not None})
        target = groups[0] if groups else DuplicateGroup.objects.create(task_id=trajectory.task_id).pk
        if len(groups) > 1:  # the new trajectory bridges groups: one group from now on
            TrajectorySignature.objects.filter(group_id__in=groups[1:]).update(group_id=target)
            DuplicateGroup.objects.filter(pk__in=groups[1:]).delete()
        joining = [c.pk for c in matches if c.group_id is None] + [trajectory_id]
        TrajectorySignature.objects.filter(pk__in=joining).update(group_id=target)
        if old_group is not None and old_group != target and old_group not in groups:
            _refresh(old_group)
        _refresh(target)
        return target


def _refresh(group_id: int | None) -> None:
    """Choose the group's kept trajectory and rewrite its members' near_duplicate flags; a group of fewer than two
    is dissolved (its last member's flag cleared)."""
    if group_id is None:
        return
    members = list(TrajectorySignature.objects.filter(group_id=group_id).values_list("trajectory_id", flat=True))
    if len(members) < 2:
        TrajectorySignature.objects.filter(group_id=group_id).update(group=None)
        DuplicateGroup.objects.filter(pk=group_id).delete()
        replace_flags_of({pk: [] for pk in members}, {NEAR_DUPLICATE})
        return
    preference = Case(
        When(status=Trajectory.Status.APPROVED, then=Value(0)),
        When(status=Trajectory.Status.SUBMITTED, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    kept = (
        Trajectory.objects.filter(pk__in=members)
        .order_by(preference, F("outcome_reward").desc(nulls_last=True), "pk")
        .values_list("pk", flat=True)
        .first()
    )
    DuplicateGroup.objects.filter(pk=group_id).exclude(kept_id=kept).update(kept_id=kept)
    flags = {}
    for pk in members:
        keep = pk == kept
        detail = (
            f"kept of {len(members)} near duplicates (group {group_id})"
            if keep
            else f"near duplicate of trajectory {kept} (group {group_id} of {len(members)})"
        )
        flags[pk] = [{"kind": NEAR_DUPLICATE, "group": group_id, "keep": keep, "of": kept, "detail": detail}]
    replace_flags_of(flags, {NEAR_DUPLICATE})


def pending_ids(limit: int) -> list[int]:
    """Finished trajectories without a signature, oldest first (an anti-join on the signature's primary key)."""
    queryset = Trajectory.objects.filter(status__in=FINISHED, signature__isnull=True).order_by("pk")
    return list(queryset.values_list("pk", flat=True)[:limit])


def dedup_pending(limit: int = 1000) -> dict[str, int]:
    """The incremental pass: sign and group up to `limit` unsigned trajectories; counts of checked and grouped."""
    ids = pending_ids(limit)
    grouped = sum(1 for pk in ids if dedup_trajectory(pk) is not None)
    return {"checked": len(ids), "grouped": grouped}


def dedup_store(*, resign: bool = False, chunk: int = 500) -> dict[str, int]:
    """The whole store: every finished trajectory (re-signed when its steps changed, or all with `resign`)."""
    checked = grouped = 0
    after = 0
    while True:
        ids = list(
            Trajectory.objects.filter(status__in=FINISHED, pk__gt=after)
            .order_by("pk")
            .values_list("pk", flat=True)[:chunk]
        )
        if not ids:
            break
        for pk in ids:
            checked += 1
            grouped += dedup_trajectory(pk, resign=resign) is not None
        after = ids[-1]
    return {"checked": checked, "grouped": grouped}
