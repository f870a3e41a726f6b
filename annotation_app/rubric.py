"""Per-project rubrics and the trajectory verdict: parse and check a rubric, parse a verdict form, record a verdict.

A project's rubric is a list of criteria `{key, label, min, max}` (ProjectSettings.rubric); a project without one
uses DEFAULT_RUBRIC. A verdict is approve/reject plus a score per criterion (Review.scores), a comment and, on
reject, a reason and the choice to send the task back to the pool (docs/review.md, "The review queue and rubric").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from .models import Assignment, ProjectSettings, Review, ReviewAssignment, Task, Trajectory, User

DEFAULT_RUBRIC: list[dict[str, Any]] = [
    {"key": "task_completed", "label": "Task completed", "min": 1, "max": 5},
    {"key": "efficient", "label": "Efficient", "min": 1, "max": 5},
    {"key": "thoughts_explain_actions", "label": "Thoughts explain actions", "min": 1, "max": 5},
]

REJECT_REASONS: dict[str, str] = {
    "task_not_done": "The task was not done",
    "wrong_actions": "Wrong or needless actions",
    "poor_thoughts": "Thoughts do not explain the actions",
    "bad_screenshots": "Bad or missing screenshots",
    "other": "Other (see the comment)",
}

MAX_CRITERIA = 12
MAX_COMMENT = 5000
KEY_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
SCORE_LIMIT = 100  # criteria's bounds stay within -100..100


class RubricError(ValueError):
    """A rubric, a verdict form or its scores were refused; `messages` lists every problem found."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__(" ".join(messages))
        self.messages = messages


class VerdictConflict(Exception):
    """The trajectory cannot take a verdict in its present state (still in progress)."""


# --- rubrics ---------------------------------------------------------------------------------------------------


def parse_rubric(value: str | list[Any]) -> list[dict[str, Any]]:
    """A rubric from JSON text or a parsed list, normalised; RubricError lists every problem (an empty list is
    allowed and means the default rubric)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno}, column {exc.colno}"
            raise RubricError([f"The rubric is not valid JSON: {exc.msg} ({where})."]) from None
    if not isinstance(value, list):
        raise RubricError(['The rubric must be a JSON list of criteria, e.g. [{"key": "efficient", ...}].'])
    if len(value) > MAX_CRITERIA:
        raise RubricError([f"A rubric has at most {MAX_CRITERIA} criteria; this one has {len(value)}."])
    problems: list[str] = []
    criteria: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, item in enumerate(value, start=1):
        where = f"Criterion {number}"
        if not isinstance(item, dict):
            problems.append(f"{where} must be an object with key, label, min and max.")
            continue
        if unknown := sorted(set(item) - {"key", "label", "min", "max"}):
            problems.append(f"{where} has unknown fields: {', '.join(map(str, unknown))}.")
        key = item.get("key")
        if not isinstance(key, str) or not KEY_PATTERN.match(key):
            problems.append(f"{where}: key must be lower-case letters, digits and _ (1-40, a letter first).")
        elif key in seen:
            problems.append(f"{where}: key {key!r} is used twice.")
        else:
            seen.add(key)
        label = item.get("label", key)
        if not isinstance(label, str) or not label.strip() or len(label) > 100:
            problems.append(f"{where}: label must be text of 1-100 characters.")
        low, high = item.get("min", 1), item.get("max", 5)
        if not all(type(b) is int and -SCORE_LIMIT <= b <= SCORE_LIMIT for b in (low, high)):
            problems.append(f"{where}: min and max must be whole numbers from {-SCORE_LIMIT} to {SCORE_LIMIT}.")
        elif low >= high:
            problems.append(f"{where}: min ({low}) must be below max ({high}).")
        if not problems:
            criteria.append({"key": key, "label": label.strip(), "min": low, "max": high})
    if problems:
        raise RubricError(problems)
    return criteria


def project_settings(project: str) -> ProjectSettings:
    """The project's settings row, or an unsaved one with the model's defaults when the lead never saved any."""
    return ProjectSettings.objects.filter(project=project).first() or ProjectSettings(project=project)


def rubric_of(settings: ProjectSettings) -> list[dict[str, Any]]:
    """The criteria a verdict is scored on: the project's rubric, or DEFAULT_RUBRIC when it has none."""
    return list(settings.rubric) if settings.rubric else [dict(c) for c in DEFAULT_RUBRIC]


def rubric_for_trajectory(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The rubric of the project of the trajectory's task."""
    return rubric_of(project_settings(trajectory.task.project))


def save_project_settings(
    project: str,
    *,
    rubric: str | list[Any],
    review_first_n: str | int,
    review_share: str | float,
    gold_rate: str | float,
) -> ProjectSettings:
    """Create or update a project's settings from form or API values; RubricError lists every problem."""
    problems: list[str] = []
    if not isinstance(project, str) or len(project) > 100:
        problems.append("The project name is at most 100 characters.")
    try:
        criteria = parse_rubric(rubric)
    except RubricError as exc:
        problems += exc.messages
        criteria = []
    first_n = _number(review_first_n, int, "Review the first N", 0, 10_000, problems)
    share = _number(review_share, float, "Review share", 0.0, 1.0, problems)
    gold = _number(gold_rate, float, "Gold rate", 0.0, 1.0, problems)
    if problems:
        raise RubricError(problems)
    row, _ = ProjectSettings.objects.update_or_create(
        project=project.strip(),
        defaults={"rubric": criteria, "review_first_n": first_n, "review_share": share, "gold_rate": gold},
    )
    return row


def _number(value: Any, kind: type, label: str, low: float, high: float, problems: list[str]) -> Any:
    """`value` as int or float within [low, high], or None with a message added to `problems`."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(str(value).strip()) if isinstance(value, str) else kind(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
    except (TypeError, ValueError):
        problems.append(f"{label} must be a {'whole number' if kind is int else 'number'} from {low} to {high}.")
        return None
    if not low <= number <= high or number != number:  # NaN fails both
        problems.append(f"{label} must be from {low} to {high}; got {value}.")
        return None
    return number


# --- verdicts --------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """A parsed verdict, ready to record."""

    verdict: str
    scores: dict[str, int] = field(default_factory=dict)
    comment: str = ""
    reason: str = ""
    send_back: bool = False
    score: int | None = None  # the older single 1-5 quality score, kept for the trajectory page's form


def parse_scores(rubric: list[dict[str, Any]], raw: Mapping[str, Any], *, complete: bool) -> dict[str, int]:
    """Scores per criterion key from raw values ('' = not scored); RubricError on unknown keys, values that are not
    whole numbers or outside the criterion's bounds, and (with `complete`) a criterion left unscored."""
    bounds = {c["key"]: c for c in rubric}
    problems = [f"{key!r} is not a criterion of this project's rubric." for key in raw if key not in bounds]
    scores: dict[str, int] = {}
    for key, criterion in bounds.items():
        value = raw.get(key, "")
        value = value.strip() if isinstance(value, str) else value
        if value in ("", None):
            if complete:
                problems.append(f"Score {criterion['label']} ({criterion['min']}-{criterion['max']}).")
            continue
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            number = int(value)
        except (TypeError, ValueError):
            problems.append(f"{criterion['label']}: {value!r} is not a whole number.")
            continue
        if not criterion["min"] <= number <= criterion["max"]:
            problems.append(
                f"{criterion['label']}: {number} is out of range; give {criterion['min']} to {criterion['max']}."
            )
            continue
        scores[key] = number
    if problems:
        raise RubricError(problems)
    return scores


def parse_verdict(
    rubric: list[dict[str, Any]],
    data: Mapping[str, Any],
    scores: Mapping[str, Any],
    *,
    complete: bool = True,
    reason_required: bool = True,
) -> Verdict:
    """A verdict from form or API values (`verdict`, `comment`, `reason`, `send_back`, `score`) and raw rubric
    scores; RubricError lists every problem."""
    problems: list[str] = []
    verdict = str(data.get("verdict", "") or "")
    if verdict not in Review.Verdict.values:
        problems.append("Choose approve or reject.")
    comment = str(data.get("comment", "") or "").strip()
    if len(comment) > MAX_COMMENT:
        problems.append(f"The comment is at most {MAX_COMMENT:,} characters.")
    reason = str(data.get("reason", "") or "")
    send_back = str(data.get("send_back", "")).lower() in {"1", "true", "on", "yes"}
    if verdict == Review.Verdict.REJECT:
        if reason and reason not in REJECT_REASONS:
            problems.append(f"Unknown rejection reason {reason!r}; choose one of {', '.join(REJECT_REASONS)}.")
        elif not reason and reason_required:
            problems.append("Say why the trajectory is rejected (choose a reason).")
    elif reason or send_back:
        reason, send_back = "", False  # only a rejection has a reason or sends the task back
    raw_score = str(data.get("score", "") or "").strip()
    score = None
    if raw_score:
        if raw_score not in {"1", "2", "3", "4", "5"}:
            problems.append("The overall score is a whole number from 1 to 5.")
        else:
            score = int(raw_score)
    try:
        parsed = parse_scores(rubric, scores, complete=complete)
    except RubricError as exc:
        problems += exc.messages
        parsed = {}
    if problems:
        raise RubricError(problems)
    return Verdict(verdict, parsed, comment, reason, send_back, score)


def scores_from_form(post: Mapping[str, Any]) -> dict[str, Any]:
    """The rubric scores of a form: fields named `score-<criterion key>`."""
    return {key.removeprefix("score-"): value for key, value in post.items() if key.startswith("score-")}


def record_verdict(trajectory: Trajectory, reviewer: User, verdict: Verdict) -> Review:
    """Record a verdict: the review row, the trajectory approved or rejected, the reviewer's queue assignment done,
    and on a rejection with `send_back` the task back to pending so the annotators' queue hands it out again."""
    with transaction.atomic():
        locked = Trajectory.objects.select_for_update().select_related("task").get(pk=trajectory.pk)
        if locked.status == Trajectory.Status.IN_PROGRESS:
            raise VerdictConflict("This trajectory is still in progress; it can be reviewed once submitted.")
        if locked.status == Trajectory.Status.ABANDONED:
            raise VerdictConflict("This trajectory was abandoned (never submitted); it cannot be reviewed.")
        comment = verdict.comment
        if verdict.reason:
            comment = f"{REJECT_REASONS[verdict.reason]}." + (f" {comment}" if comment else "")
        review = Review.objects.create(
            trajectory=locked,
            reviewer=reviewer,
            verdict=verdict.verdict,
            score=verdict.score,
            scores=verdict.scores,
            comment=comment,
        )
        rejected = verdict.verdict == Review.Verdict.REJECT
        locked.status = Trajectory.Status.REJECTED if rejected else Trajectory.Status.APPROVED
        if rejected:
            sent_back = verdict.send_back and _send_task_back(locked.task)
            locked.metadata = dict(locked.metadata or {}) | {
                "rejection": {"review": review.pk, "reason": verdict.reason, "sent_back": sent_back}
            }
        locked.save(update_fields=["status", "metadata", "updated_at"])
        ReviewAssignment.objects.filter(trajectory=locked, status=ReviewAssignment.Status.ACTIVE).update(
            status=ReviewAssignment.Status.DONE, finished_at=timezone.now()
        )
    trajectory.refresh_from_db()
    return review


def _send_task_back(task: Task) -> bool:
    """Put the task back in the pool (pending: the queue hands it to one more annotator, never to one who did it)
    unless it is archived or as many annotators as it asks for (k) are working on it now."""
    locked = Task.objects.select_for_update().get(pk=task.pk)
    if locked.status == Task.Status.ARCHIVED:
        return False
    holders = Assignment.objects.filter(task=locked, status=Assignment.Status.ACTIVE).count()
    if holders >= max(locked.required_annotations, 1):
        return False
    Task.objects.filter(pk=locked.pk).update(status=Task.Status.PENDING, updated_at=timezone.now())
    task.status = Task.Status.PENDING
    return True
