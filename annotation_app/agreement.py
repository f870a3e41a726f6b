"""Agreement between annotators who did the same task (dual annotation), per task and per annotator pair.

For every pair of annotations of a task (the latest finished trajectory of each annotator):
- outcome: both succeeded or both failed by the task's verifier (`outcome_reward` >= 0.5) where both have a result,
  otherwise by the reviewers' latest verdicts (approve/reject); None where neither is known;
- first step: the first actions, taken on the same initial screen, have the same type and, for pointing actions,
  points in the same UI element (the task's `metadata.initial_elements`, boxes [x1, y1, x2, y2] in screen pixels,
  when the task has them) or within TOLERANCE_PX of each other (in the first trajectory's screen frame);
- similarity: 1 - normalised Levenshtein distance (rapidfuzz) over the sequences of (action type, target) tokens,
  targets being points on a GRID x GRID grid of the screen, typed text, keys, scroll direction, URL or app.
Per task, Krippendorff's alpha (the `krippendorff` package, ordinal) over the rubric scores (Review.scores) where
several reviewers scored the same trajectories: units are (trajectory, criterion), coders the reviewers.

The pure functions take plain values; `load_annotations` reads everything in a few bulk queries, so the agreement
of 10k tasks is one pass (bench/agreement.py).
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import krippendorff
import numpy as np
from django.core.cache import cache
from django.db.models import Count, Max, Q, QuerySet, Sum
from rapidfuzz.distance import Levenshtein

from .models import Review, Step, StepEdit, Task, Trajectory, User

TOLERANCE_PX = 30.0  # first-step click points this close (screen pixels) agree when no element boxes are known
GRID = 20  # later steps' points are compared on a GRID x GRID grid of the screen
SUCCESS = 0.5  # an outcome_reward at or above this is a success
DEFAULT_THRESHOLD = 0.5  # a task whose agreement is below this is a disagreement for the lead to adjudicate
CACHE_SECONDS = 600
FINISHED = (Trajectory.Status.SUBMITTED, Trajectory.Status.APPROVED, Trajectory.Status.REJECTED)
POINT_FIELDS = ("point", "start", "end")
TARGET_FIELDS = ("content", "keys", "direction", "url", "key", "app_name")

Box = tuple[float, float, float, float]


@dataclass
class Annotation:
    """One annotator's latest finished trajectory of a task, reduced to what agreement needs."""

    trajectory_id: int
    task_id: int
    annotator_id: int
    width: int
    height: int
    outcome: float | None = None
    verdict: str | None = None  # the latest review's verdict
    steps: list[list[dict[str, Any]]] = field(default_factory=list)  # each step's typed actions
    scores: dict[int, dict[str, float]] = field(default_factory=dict)  # reviewer id -> latest rubric scores


# --- pure functions ------------------------------------------------------------------------------------------------


def action_token(action: dict[str, Any], width: int, height: int) -> tuple:
    """(type, target) of one typed action: points on the screen grid, other targets as their normalised value."""
    kind = action.get("type", "")
    target: list[Any] = []
    for name in POINT_FIELDS:
        point = action.get(name)
        if point:
            target.append((int(point[0] * GRID / max(width, 1)), int(point[1] * GRID / max(height, 1))))
    for name in TARGET_FIELDS:
        value = action.get(name)
        if value is not None and not (kind == "finished" and name == "content"):
            target.append(" ".join(value).lower() if isinstance(value, list) else str(value).strip().lower())
    return (kind, *target)


def step_tokens(steps: Sequence[Sequence[dict[str, Any]]], width: int, height: int) -> list[tuple]:
    """A trajectory's steps as hashable tokens (a step of several actions is one token of their tokens)."""
    return [tuple(action_token(a, width, height) for a in actions) for actions in steps]


def similarity(a: Sequence[tuple], b: Sequence[tuple]) -> float:
    """1 - normalised edit distance between two token sequences (1.0: the same actions on the same targets)."""
    if not a and not b:
        return 1.0
    return 1.0 - Levenshtein.normalized_distance(a, b)


def _points(actions: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    return [(float(a[n][0]), float(a[n][1])) for a in actions for n in POINT_FIELDS if a.get(n)]


def _element(point: tuple[float, float], boxes: Sequence[Box]) -> int | None:
    """Index of the smallest box holding the point (the innermost element), or None."""
    inside = [
        (abs((b[2] - b[0]) * (b[3] - b[1])), i)
        for i, b in enumerate(boxes)
        if b[0] <= point[0] <= b[2] and b[1] <= point[1] <= b[3]
    ]
    return min(inside)[1] if inside else None


def first_step_agrees(
    a: Sequence[dict[str, Any]],
    b: Sequence[dict[str, Any]],
    *,
    scale: tuple[float, float] = (1.0, 1.0),
    boxes: Sequence[Box] = (),
    tolerance: float = TOLERANCE_PX,
) -> bool:
    """Whether two first steps agree: the same action types, non-point targets equal, and each pair of points in
    the same element (when boxes are known and hold both points) or within `tolerance` pixels. `scale` maps b's
    screen frame into a's."""
    if [x.get("type") for x in a] != [y.get("type") for y in b]:
        return False
    for x, y in zip(a, b, strict=True):
        for name in TARGET_FIELDS:
            if name in x and action_token({name: x[name]}, 1, 1) != action_token({name: y.get(name)}, 1, 1):
                return False
    points_a = _points(a)
    points_b = [(p[0] * scale[0], p[1] * scale[1]) for p in _points(b)]
    if len(points_a) != len(points_b):
        return False
    for p, q in zip(points_a, points_b, strict=True):
        ep, eq = (_element(p, boxes), _element(q, boxes)) if boxes else (None, None)
        if ep is not None and eq is not None:
            if ep != eq:
                return False
        elif math.dist(p, q) > tolerance:
            return False
    return True


def outcome_agrees(a: Annotation, b: Annotation) -> bool | None:
    """Verifier results where both have one, else the reviewers' verdicts where both have one, else None."""
    if a.outcome is not None and b.outcome is not None:
        return (a.outcome >= SUCCESS) == (b.outcome >= SUCCESS)
    if a.verdict and b.verdict:
        return a.verdict == b.verdict
    return None


def rubric_alpha(scores: Iterable[tuple[str, str, float]], level: str = "ordinal") -> float | None:
    """Krippendorff's alpha over (unit, coder, value) rubric scores (ordinal: 1-5 scores are ranks); None where it is
    undefined (no unit with two coders, or a single value used throughout)."""
    by_unit: dict[str, dict[str, float]] = defaultdict(dict)
    for unit, coder, value in scores:
        by_unit[unit][coder] = float(value)
    units = [u for u, coders in by_unit.items() if len(coders) >= 2]
    coders = sorted({c for u in units for c in by_unit[u]})
    if not units:
        return None
    data = np.full((len(coders), len(units)), np.nan)
    for j, unit in enumerate(units):
        for coder, value in by_unit[unit].items():
            data[coders.index(coder), j] = value
    if len(np.unique(data[~np.isnan(data)])) < 2:
        return None
    return float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))


def _mean(values: Iterable[float | bool | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def compare(a: Annotation, b: Annotation, boxes: Sequence[Box] = ()) -> dict[str, Any]:
    """One pair's figures: outcome and first-step agreement (bool or None) and trajectory similarity (0..1)."""
    first = None
    if a.steps and b.steps:
        scale = (a.width / max(b.width, 1), a.height / max(b.height, 1))
        first = first_step_agrees(a.steps[0], b.steps[0], scale=scale, boxes=boxes)
    return {
        "trajectories": (a.trajectory_id, b.trajectory_id),
        "annotators": (a.annotator_id, b.annotator_id),
        "outcome": outcome_agrees(a, b),
        "first_step": first,
        "similarity": similarity(step_tokens(a.steps, a.width, a.height), step_tokens(b.steps, b.width, b.height)),
    }


def agreement_of(annotations: Sequence[Annotation], boxes: Sequence[Box] = ()) -> dict[str, Any] | None:
    """A task's agreement from its annotations (None with fewer than two): the pairs, the share of agreeing pairs
    per measure, the mean similarity, the rubric alpha, and `agreement`, the mean of the measures known."""
    if len(annotations) < 2:
        return None
    ordered = sorted(annotations, key=lambda x: x.annotator_id)
    pairs = [compare(a, b, boxes) for a, b in combinations(ordered, 2)]
    outcome = _mean(p["outcome"] for p in pairs)
    first = _mean(p["first_step"] for p in pairs)
    sim = _mean(p["similarity"] for p in pairs)
    alpha = rubric_alpha(
        (f"{a.trajectory_id}:{criterion}", str(reviewer), value)
        for a in ordered
        for reviewer, scores in a.scores.items()
        for criterion, value in scores.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    )
    return {
        "task_id": ordered[0].task_id,
        "trajectories": [a.trajectory_id for a in ordered],
        "annotators": [a.annotator_id for a in ordered],
        "pairs": pairs,
        "outcome_agreement": outcome,
        "first_step_agreement": first,
        "similarity": sim,
        "alpha": alpha,
        "agreement": _mean([outcome, first, sim]),
    }


# --- reading the database ------------------------------------------------------------------------------------------


def _annotated(task_ids: Iterable[int] | None = None) -> QuerySet[Trajectory]:
    """Finished trajectories by annotators (rollouts excluded), of the given tasks or all."""
    rows = Trajectory.objects.filter(status__in=FINISHED, annotator__isnull=False).exclude(mode=Trajectory.Mode.ROLLOUT)
    return rows if task_ids is None else rows.filter(task_id__in=list(task_ids))


def _overlapping(task_ids: Iterable[int] | None = None) -> QuerySet:
    """The ids of tasks with finished trajectories of at least two different annotators, as a subquery."""
    return (
        _annotated(task_ids)
        .order_by()
        .values("task_id")
        .annotate(n=Count("annotator", distinct=True))
        .filter(n__gte=2)
        .values("task_id")
    )


def overlapping_task_ids(task_ids: Iterable[int] | None = None) -> list[int]:
    """Tasks with finished trajectories of at least two different annotators."""
    return sorted(_overlapping(task_ids).values_list("task_id", flat=True))


def load_annotations(task_ids: Iterable[int] | None = None) -> dict[int, list[Annotation]]:
    """{task id: annotations} of the overlapping tasks (all, or those given), in three bulk queries.

    The overlapping tasks are a subquery each query joins on (PostgreSQL runs it once, hashed), never a list of ids
    sent back and forth; each annotator's latest trajectory is picked here."""
    task_ids = None if task_ids is None else list(task_ids)
    overlapping = _overlapping(task_ids)
    found: dict[int, Annotation] = {}
    latest: dict[tuple[int, int], int] = {}
    rows = _annotated(task_ids).filter(task_id__in=overlapping).order_by("id")
    for pk, task_id, annotator_id, width, height, outcome in rows.values_list(
        "pk", "task_id", "annotator_id", "screen_width", "screen_height", "outcome_reward"
    ):
        latest[(task_id, annotator_id)] = pk  # ordered by id: the last one wins
        found[pk] = Annotation(pk, task_id, annotator_id, width, height, outcome)
    found = {pk: found[pk] for pk in latest.values()}
    if not found:
        return {}
    in_scope = {"trajectory__task_id__in": overlapping, "trajectory__status__in": FINISHED}
    steps = (
        Step.objects.filter(**in_scope)
        .exclude(status=Step.Status.CUT)
        .order_by("trajectory_id", "index")
        .values_list("trajectory_id", "action")
    )
    bulk = task_ids is None  # a server-side cursor pays off for every task, not for a page's one or two
    for trajectory_id, action in steps.iterator(chunk_size=10000) if bulk else steps:
        annotation = found.get(trajectory_id)
        if annotation is not None:
            annotation.steps.append((action or {}).get("actions", []))
    reviews = (
        Review.objects.filter(**in_scope)
        .order_by("trajectory_id", "created_at", "id")
        .values_list("trajectory_id", "reviewer_id", "verdict", "scores")
    )
    for trajectory_id, reviewer_id, verdict, scores in reviews.iterator(chunk_size=10000) if bulk else reviews:
        annotation = found.get(trajectory_id)
        if annotation is not None:
            annotation.verdict = verdict  # the latest wins
            if scores:
                annotation.scores[reviewer_id] = scores
    by_task: dict[int, list[Annotation]] = defaultdict(list)
    for annotation in found.values():
        by_task[annotation.task_id].append(annotation)
    return dict(by_task)


def element_boxes(task_ids: Iterable[int] | None = None) -> dict[int, list[Box]]:
    """The tasks' (or every task's) initial-screen element boxes (metadata.initial_elements), where well-formed."""
    out: dict[int, list[Box]] = {}
    rows = Task.objects.filter(metadata__has_key="initial_elements")
    if task_ids is not None:
        rows = rows.filter(pk__in=list(task_ids))
    for pk, boxes in rows.values_list("pk", "metadata__initial_elements"):
        good = [
            tuple(float(v) for v in b)
            for b in boxes or []
            if isinstance(b, list) and len(b) == 4 and all(isinstance(v, int | float) for v in b)
        ]
        if good:
            out[pk] = good  # type: ignore[assignment]
    return out


def all_task_agreements(task_ids: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
    """{task id: task agreement} of every overlapping task (or of those given)."""
    annotations = load_annotations(task_ids)
    boxes = element_boxes(None if task_ids is None else annotations)
    out = {}
    for task_id, found in annotations.items():
        result = agreement_of(found, boxes.get(task_id, ()))
        if result is not None:
            out[task_id] = result
    return out


def fingerprint() -> str:
    """A cheap summary of everything agreement reads (finished trajectories, their reviews and step edits): it
    changes whenever a result could, so cached results are keyed on it."""
    t = Trajectory.objects.filter(status__in=FINISHED, annotator__isnull=False).aggregate(
        n=Count("pk"),
        last=Max("updated_at"),
        approved=Count("pk", filter=Q(status=Trajectory.Status.APPROVED)),
        rejected=Count("pk", filter=Q(status=Trajectory.Status.REJECTED)),
        scored=Count("outcome_reward"),
        outcomes=Sum("outcome_reward"),
    )  # counts and sums too: a queryset.update() leaves updated_at as it was
    r = Review.objects.aggregate(n=Count("pk"), last=Max("pk"))
    e = StepEdit.objects.aggregate(n=Count("pk"), last=Max("pk"))
    boxes = Task.objects.exclude(metadata__initial_elements=None).aggregate(last=Max("updated_at"))
    return ":".join(str(v) for v in (*t.values(), *r.values(), *e.values(), boxes["last"]))


def cached_task_agreements() -> dict[int, dict[str, Any]]:
    """all_task_agreements(), kept in the cache until anything it reads changes (or CACHE_SECONDS pass): the lead's
    agreement page and the review queue ask for it often, and 10k tasks take seconds to compute."""
    key = "agreement:all:" + hashlib.sha256(fingerprint().encode()).hexdigest()[:32]
    found = cache.get(key)
    if found is None:
        found = all_task_agreements()
        cache.set(key, found, CACHE_SECONDS)
    return found


def task_agreement(task_id: int) -> dict[str, Any] | None:
    """One task's agreement (see agreement_of), or None where fewer than two annotators finished it."""
    return all_task_agreements([task_id]).get(task_id)


def low_agreement_task_ids(threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Overlapping tasks whose agreement is below `threshold`, the least agreeing first."""
    scored = [(r["agreement"], pk) for pk, r in cached_task_agreements().items() if r["agreement"] is not None]
    return [pk for value, pk in sorted(scored) if value < threshold]


def pair_agreement(agreements: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per annotator pair over the tasks both did: tasks, outcome and first-step agreement rates, mean similarity."""
    agreements = cached_task_agreements() if agreements is None else agreements
    pairs: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for result in agreements.values():
        for pair in result["pairs"]:
            pairs[tuple(sorted(pair["annotators"]))].append(pair)  # type: ignore[index]
    names = dict(User.objects.filter(pk__in={a for key in pairs for a in key}).values_list("pk", "username"))
    rows = []
    for (a, b), found in sorted(pairs.items()):
        rows.append(
            {
                "annotators": (a, b),
                "names": (names.get(a, str(a)), names.get(b, str(b))),
                "tasks": len(found),
                "outcome_agreement": _mean(p["outcome"] for p in found),
                "first_step_agreement": _mean(p["first_step"] for p in found),
                "similarity": _mean(p["similarity"] for p in found),
            }
        )
    return rows


def disagreements(agreements: dict[int, dict[str, Any]], threshold: float = DEFAULT_THRESHOLD) -> list[dict[str, Any]]:
    """The tasks to adjudicate: agreement below `threshold`, or annotators split on the outcome; least first."""
    rows = [
        r
        for r in agreements.values()
        if (r["agreement"] is not None and r["agreement"] < threshold)
        or (r["outcome_agreement"] is not None and r["outcome_agreement"] < 1)
    ]
    return sorted(rows, key=lambda r: (r["agreement"] if r["agreement"] is not None else 1.0, r["task_id"]))
