"""The data leads' review queue: which submitted trajectories need a review, in what order, and who reviews which.

Sampling (per project, ProjectSettings): every one of an annotator's first `review_first_n` submitted trajectories
is reviewed; after that a stable share `review_share`, chosen by a hash of the trajectory's id (the same answer on
every evaluation); trajectories with curation flags or on low-agreement tasks are always reviewed.
Priority: new annotators first, then low-agreement tasks, then curation flags, then sampled ones; oldest first.
Hand-out: `SELECT … FOR UPDATE SKIP LOCKED` one row at a time, plus the partial unique index (one active review
assignment per trajectory), so two reviewers never get the same trajectory; nobody reviews their own.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .models import ProjectSettings, ReviewAssignment, Trajectory, User

log = logging.getLogger(__name__)

REASONS = {
    "new_annotator": (0, "New annotator"),
    "low_agreement": (1, "Low agreement"),
    "flagged": (2, "Curation flag"),
    "resubmitted": (3, "Resubmitted after a rejection"),
    "sampled": (4, "Sampled"),
}
_DEFAULT_FIRST_N = ProjectSettings._meta.get_field("review_first_n").default
_DEFAULT_SHARE = ProjectSettings._meta.get_field("review_share").default


class ReviewQueueEmpty(Exception):
    """Nothing is left for this reviewer to review."""


@dataclass(frozen=True)
class QueueEntry:
    """One trajectory waiting for review, with why and how urgently (lower priority first)."""

    trajectory_id: int
    task_id: int
    annotator_id: int | None
    annotator: str
    instruction: str
    submitted_at: datetime | None
    rank: int
    flag_kinds: tuple[str, ...]
    reason: str
    priority: int

    @property
    def reason_label(self) -> str:
        return REASONS[self.reason][1]


def sample_value(trajectory_id: int) -> float:
    """A stable pseudo-random number in [0, 1) for a trajectory: the first 32 bits of md5('review:<id>').
    The queue's SQL computes the same value (see _CANDIDATES), so Python and PostgreSQL agree."""
    digest = hashlib.md5(f"review:{trajectory_id}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16) / 2**32


def review_reason(
    rank: int, first_n: int, share: float, trajectory_id: int, *, flagged: bool, low: bool, reviewed: bool = False
) -> str:
    """Why a trajectory (its annotator's `rank`-th submission, 1-based) is reviewed, or '' when it is not sampled;
    the Python statement of the rule the queue's SQL applies."""
    if rank <= first_n:
        return "new_annotator"
    if low:
        return "low_agreement"
    if flagged:
        return "flagged"
    if reviewed:
        return "resubmitted"
    return "sampled" if sample_value(trajectory_id) < share else ""


def low_agreement_task_ids() -> list[int]:
    """Tasks whose annotators disagree, from annotation_app.agreement when it offers them; [] otherwise."""
    try:
        from . import agreement  # built alongside; the queue orders by the other keys without it
    except ImportError:
        return []
    finder = getattr(agreement, "low_agreement_task_ids", None)
    if finder is None:
        return []
    try:
        return [int(i) for i in finder()]  # below agreement.DEFAULT_THRESHOLD: one threshold, kept there
    except Exception:  # agreement is one ordering key among four: the queue keeps working without it
        log.exception("low_agreement_task_ids failed; the review queue orders without it")
        return []


# Ranks count every submitted trajectory of an annotator (reviewed or not) in the order they were made, so a
# resubmission does not move them; the sample value is md5-based as in
# sample_value(). Parameters: first_n default, share default, low-agreement task ids, reviewer id, flag filter
# (jsonb or NULL), limit.
_CANDIDATES = """
WITH ranked AS (
    SELECT t.id, t.task_id, t.annotator_id, t.status, t.submitted_at, t.flags, tk.project, tk.instruction,
           row_number() OVER (PARTITION BY t.annotator_id ORDER BY t.id) AS rank
    FROM annotation_app_trajectory t JOIN annotation_app_task tk ON tk.id = t.task_id
    WHERE t.submitted_at IS NOT NULL
), scored AS (
    SELECT r.*,
           r.rank <= COALESCE(ps.review_first_n, %(first_n)s) AS is_new,
           r.task_id = ANY(%(low)s) AS is_low,
           jsonb_typeof(r.flags) = 'array' AND jsonb_array_length(r.flags) > 0 AS is_flagged,
           (('x' || substr(md5('review:' || r.id::text), 1, 8))::bit(32)::bigint / 4294967296.0)
               < COALESCE(ps.review_share, %(share)s) AS is_sampled,
           EXISTS (SELECT 1 FROM annotation_app_review rv WHERE rv.trajectory_id = r.id) AS is_resubmitted
    FROM ranked r LEFT JOIN annotation_app_projectsettings ps ON ps.project = r.project
    WHERE r.status = 'submitted'
      AND (r.annotator_id IS NULL OR r.annotator_id <> %(reviewer)s)
      AND NOT EXISTS (SELECT 1 FROM annotation_app_reviewassignment ra
                      WHERE ra.trajectory_id = r.id AND ra.status = 'active')
      AND (%(flag)s::jsonb IS NULL OR r.flags @> %(flag)s::jsonb)
)
SELECT s.id, s.task_id, s.annotator_id, COALESCE(u.username, ''), s.instruction, s.submitted_at, s.rank, s.flags,
       CASE WHEN s.is_new THEN 0 WHEN s.is_low THEN 1 WHEN s.is_flagged THEN 2 WHEN s.is_resubmitted THEN 3
            ELSE 4 END AS priority
FROM scored s LEFT JOIN annotation_app_user u ON u.id = s.annotator_id
WHERE s.is_new OR s.is_low OR s.is_flagged OR s.is_resubmitted OR s.is_sampled
ORDER BY priority, s.submitted_at, s.id
LIMIT %(limit)s
"""


def _flag_kinds(flags: Any) -> tuple[str, ...]:
    if not isinstance(flags, list):
        return ()
    return tuple(dict.fromkeys(str(f.get("kind", "")) for f in flags if isinstance(f, dict) and f.get("kind")))


def pending_reviews(
    reviewer: User | None = None, *, flag: str = "", limit: int = 50, low_tasks: list[int] | None = None
) -> list[QueueEntry]:
    """The queue in hand-out order: submitted, sampled for review, not held by a reviewer, not `reviewer`'s own;
    with `flag`, only trajectories carrying a curation flag of that kind. `low_tasks` defaults to
    low_agreement_task_ids()."""
    names = [name for name, _ in sorted(REASONS.items(), key=lambda item: item[1][0])]
    params = {
        "first_n": _DEFAULT_FIRST_N,
        "share": _DEFAULT_SHARE,
        "low": low_agreement_task_ids() if low_tasks is None else list(low_tasks),
        "reviewer": reviewer.pk if reviewer is not None else -1,
        "flag": json.dumps([{"kind": flag}]) if flag else None,
        "limit": limit,
    }
    with connection.cursor() as cursor:
        cursor.execute(_CANDIDATES, params)
        rows = cursor.fetchall()
    return [
        QueueEntry(
            trajectory_id=row[0],
            task_id=row[1],
            annotator_id=row[2],
            annotator=row[3],
            instruction=row[4],
            submitted_at=row[5],
            rank=row[6],
            flag_kinds=_flag_kinds(row[7] if not isinstance(row[7], str) else json.loads(row[7])),
            reason=names[row[8]],
            priority=row[8],
        )
        for row in rows
    ]


def flag_kinds_in_queue() -> list[str]:
    """The curation flag kinds found on submitted trajectories (the queue page's filter choices)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT f->>'kind' FROM annotation_app_trajectory t, jsonb_array_elements("
            "CASE WHEN jsonb_typeof(t.flags) = 'array' THEN t.flags ELSE '[]'::jsonb END) f "
            "WHERE t.status = 'submitted' AND f->>'kind' IS NOT NULL ORDER BY 1"
        )
        return [row[0] for row in cursor.fetchall()]


def current_review(reviewer: User) -> ReviewAssignment | None:
    """The reviewer's active review assignment, if they hold one."""
    return (
        ReviewAssignment.objects.select_related("trajectory__task", "trajectory__annotator")
        .filter(reviewer=reviewer, status=ReviewAssignment.Status.ACTIVE)
        .order_by("assigned_at")
        .first()
    )


def next_review(reviewer: User, *, flag: str = "", batch: int = 20) -> ReviewAssignment:
    """The reviewer's active review, or the next trajectory in the queue claimed for them; ReviewQueueEmpty when
    nothing is left. Concurrent reviewers never get the same trajectory (SKIP LOCKED, then the unique index)."""
    active = current_review(reviewer)
    if active is not None:
        return active
    held = ReviewAssignment.objects.filter(trajectory=OuterRef("pk"), status=ReviewAssignment.Status.ACTIVE)
    low = low_agreement_task_ids()  # before the transaction: it may take seconds when its cache is cold
    with transaction.atomic():
        # One reviewer's own concurrent requests (double clicks) end with one assignment, not two.
        User.objects.select_for_update().filter(pk=reviewer.pk).values_list("pk", flat=True).get()
        active = current_review(reviewer)
        if active is not None:
            return active
        tried: set[int] = set()
        for limit in (batch, batch * 4, batch * 16):  # wider only when everything seen was taken meanwhile
            entries = pending_reviews(reviewer, flag=flag, limit=limit, low_tasks=low)
            for entry in entries:
                if entry.trajectory_id in tried:
                    continue
                tried.add(entry.trajectory_id)
                claimed = (
                    Trajectory.objects.select_for_update(skip_locked=True)
                    .filter(pk=entry.trajectory_id, status=Trajectory.Status.SUBMITTED)
                    .exclude(Exists(held))
                    .values_list("pk", flat=True)
                    .first()
                )
                if claimed is None:
                    continue  # another reviewer holds or just took it
                try:
                    with transaction.atomic():
                        return ReviewAssignment.objects.create(
                            trajectory_id=claimed, reviewer=reviewer, reason=entry.reason
                        )
                except IntegrityError:  # the unique index caught a race the lock did not
                    continue
            if len(entries) < limit:
                break
    raise ReviewQueueEmpty("No trajectories are waiting for review" + (f" with flag {flag!r}." if flag else "."))


def release_review(reviewer: User) -> int:
    """Give the reviewer's active review back to the queue (another reviewer may take it); how many were released."""
    return ReviewAssignment.objects.filter(reviewer=reviewer, status=ReviewAssignment.Status.ACTIVE).update(
        status=ReviewAssignment.Status.RELEASED, finished_at=timezone.now()
    )
