"""Recompute the quality aggregates from the task, trajectory, step and review tables in one consistent snapshot.

The work is a handful of INSERT … SELECT statements run by PostgreSQL in one REPEATABLE READ transaction, so readers
see the previous aggregates until the new ones commit, and a concurrent refresh is skipped (an advisory lock)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from annotation_app import agreement
from annotation_app.models import Review, ReviewAssignment, Step, Task, Trajectory, User
from flywheel.models import ModelVersion

from .models import AnnotatorStats, Coverage, ModelAcceptance, Refresh, Throughput

LOCK_KEY = 0x5175616C  # "Qual": one refresh at a time across every worker
# Gold accuracy is the mean verifier reward of finished gold-task trajectories (as annotation_app.gold computes it);
# for peer agreement, a trajectory with a reward counts as a success when the reward reaches PASS.
PASS = 0.5
# AnnotatorStats field: agreement.pair_agreement key.
PEER_MEASURES = {
    "peer_outcome": "outcome_agreement",
    "peer_first_step": "first_step_agreement",
    "peer_similarity": "similarity",
}
KEEP_HISTORY = timedelta(days=7)  # older refresh records are pruned
SUBMITTED = (Trajectory.Status.SUBMITTED, Trajectory.Status.APPROVED, Trajectory.Status.REJECTED)

T = {
    "task": Task._meta.db_table,
    "traj": Trajectory._meta.db_table,
    "step": Step._meta.db_table,
    "review": Review._meta.db_table,
    "assign": ReviewAssignment._meta.db_table,
    "user": User._meta.db_table,
    "model": ModelVersion._meta.db_table,
    "a_stats": AnnotatorStats._meta.db_table,
    "a_through": Throughput._meta.db_table,
    "a_accept": ModelAcceptance._meta.db_table,
    "a_cover": Coverage._meta.db_table,
}
SUBMITTED_SQL = "(" + ", ".join(f"'{s}'" for s in SUBMITTED) + ")"

# The human work (simulated annotators left out: they are programs, not people to compare): trajectories with an
# annotator, their steps with the seconds each took where it was timed (live
# steps: from the proposals shown to the action run; think-aloud steps: from the previous action's end to this one's,
# on the capture's clock).
WORK_CTE = f"""
traj AS (
    SELECT t.id, t.annotator_id, t.task_id, t.status, t.submitted_at, t.outcome_reward, k.is_gold
    FROM {T["traj"]} t JOIN {T["task"]} k ON k.id = t.task_id
    WHERE t.annotator_id IS NOT NULL AND NOT t.simulated
),
submitted AS (SELECT * FROM traj WHERE status IN {SUBMITTED_SQL}),
capture_end AS (
    SELECT s.trajectory_id, traj.annotator_id, s.index, s.created_at, s.started_at, s.finished_at,
        CASE WHEN jsonb_typeof(s.action -> 't' -> 1) = 'number' THEN (s.action -> 't' ->> 1)::float END AS t_end
    FROM {T["step"]} s JOIN traj ON traj.id = s.trajectory_id
),
steps AS (
    SELECT c.trajectory_id, c.annotator_id, c.created_at,
        CASE
            WHEN c.started_at IS NOT NULL AND c.finished_at >= c.started_at
                THEN extract(epoch FROM c.finished_at - c.started_at)
            WHEN c.t_end IS NOT NULL
                THEN c.t_end - coalesce(lag(c.t_end) OVER (PARTITION BY c.trajectory_id ORDER BY c.index), 0)
        END AS seconds
    FROM capture_end c
)
"""

ANNOTATORS_SQL = f"""
WITH {WORK_CTE},
latest_review AS (
    SELECT DISTINCT ON (r.trajectory_id) r.trajectory_id, r.verdict
    FROM {T["review"]} r JOIN submitted ON submitted.id = r.trajectory_id
    ORDER BY r.trajectory_id, r.created_at DESC, r.id DESC
),
judged AS (
    SELECT s.id, s.annotator_id, s.task_id, s.is_gold, s.outcome_reward, lr.verdict,
        CASE WHEN s.outcome_reward IS NOT NULL THEN s.outcome_reward >= %(pass)s
             WHEN lr.verdict IS NOT NULL THEN lr.verdict = 'approve' END AS ok
    FROM submitted s LEFT JOIN latest_review lr ON lr.trajectory_id = s.id
),
per_traj AS (
    SELECT annotator_id, count(*) AS trajectories,
        count(verdict) AS reviewed, count(*) FILTER (WHERE verdict = 'approve') AS passed,
        count(*) FILTER (WHERE is_gold AND outcome_reward IS NOT NULL) AS gold_scored,
        coalesce(sum(outcome_reward) FILTER (WHERE is_gold), 0) AS gold_reward_sum
    FROM judged GROUP BY annotator_id
),
pairs AS (
    SELECT a.annotator_id, count(*) AS peer_pairs, count(*) FILTER (WHERE a.ok = b.ok) AS peer_agreed
    FROM judged a JOIN judged b ON b.task_id = a.task_id AND b.annotator_id <> a.annotator_id
    WHERE a.ok IS NOT NULL AND b.ok IS NOT NULL
    GROUP BY a.annotator_id
),
per_step AS (
    SELECT annotator_id, count(*) AS steps,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) FILTER (WHERE seconds >= 0) AS median_step_s
    FROM steps GROUP BY annotator_id
),
activity AS (
    SELECT annotator_id, date_trunc('hour', created_at) AS hour FROM steps
    UNION SELECT annotator_id, date_trunc('hour', submitted_at) FROM submitted WHERE submitted_at IS NOT NULL
),
active AS (
    SELECT annotator_id, count(*) AS hours, count(DISTINCT date_trunc('day', hour)) AS days
    FROM activity GROUP BY annotator_id
)
INSERT INTO {T["a_stats"]} (annotator_id, username, trajectories, steps, active_hours, active_days, median_step_s,
    reviewed, passed, gold_scored, gold_reward_sum, peer_pairs, peer_agreed, peer_tasks)
SELECT u.id, u.username, coalesce(pt.trajectories, 0), coalesce(ps.steps, 0), coalesce(ac.hours, 0),
    coalesce(ac.days, 0), ps.median_step_s, coalesce(pt.reviewed, 0), coalesce(pt.passed, 0),
    coalesce(pt.gold_scored, 0), coalesce(pt.gold_reward_sum, 0), coalesce(pr.peer_pairs, 0),
    coalesce(pr.peer_agreed, 0), 0
FROM {T["user"]} u
    JOIN (SELECT DISTINCT annotator_id FROM traj) who ON who.annotator_id = u.id
    LEFT JOIN per_traj pt ON pt.annotator_id = u.id
    LEFT JOIN per_step ps ON ps.annotator_id = u.id
    LEFT JOIN pairs pr ON pr.annotator_id = u.id
    LEFT JOIN active ac ON ac.annotator_id = u.id
"""

THROUGHPUT_SQL = f"""
WITH {WORK_CTE},
events AS (
    SELECT annotator_id, submitted_at::date AS day, 1 AS trajectories, 0 AS steps
    FROM submitted WHERE submitted_at IS NOT NULL
    UNION ALL SELECT annotator_id, created_at::date, 0, 1 FROM steps
)
INSERT INTO {T["a_through"]} (annotator_id, day, trajectories, steps)
SELECT annotator_id, day, sum(trajectories), sum(steps) FROM events
GROUP BY GROUPING SETS ((annotator_id, day), (day))
"""

# A step that showed candidates: accepted (one chosen, its action run unchanged), edited (chosen, the step's action
# changed since, e.g. by a reviewer) or overridden (none chosen). Its action type is the chosen candidate's, else
# the first candidate's.
ACCEPTANCE_SQL = f"""
WITH proposed AS (
    SELECT s.model_version_id,
        coalesce(s.candidates -> coalesce(s.chosen_candidate, 0) -> 'actions' -> 0 ->> 'type', 'none') AS action_type,
        CASE WHEN s.chosen_candidate IS NULL THEN 'overridden'
             WHEN s.action_text = s.candidates -> s.chosen_candidate ->> 'action_text' THEN 'accepted'
             ELSE 'edited' END AS outcome
    FROM {T["step"]} s
    WHERE s.model_version_id IS NOT NULL AND jsonb_typeof(s.candidates) = 'array'
        AND jsonb_array_length(s.candidates) > 0
),
counted AS (
    SELECT model_version_id, CASE WHEN GROUPING(action_type) = 1 THEN '' ELSE action_type END AS action_type,
        count(*) AS proposals, count(*) FILTER (WHERE outcome = 'accepted') AS accepted,
        count(*) FILTER (WHERE outcome = 'edited') AS edited,
        count(*) FILTER (WHERE outcome = 'overridden') AS overridden
    FROM proposed GROUP BY GROUPING SETS ((model_version_id, action_type), (model_version_id))
)
INSERT INTO {T["a_accept"]} (model_version_id, model_name, model_created_at, action_type, proposals, accepted,
    edited, overridden)
SELECT m.id, m.name, m.created_at, c.action_type, c.proposals, c.accepted, c.edited, c.overridden
FROM counted c JOIN {T["model"]} m ON m.id = c.model_version_id
"""

COVERAGE_SQL = f"""
INSERT INTO {T["a_cover"]} (dimension, key, count, completed)
SELECT 'domain', domain, count(*), count(*) FILTER (WHERE status = 'completed')
    FROM {T["task"]} WHERE status <> 'archived' GROUP BY domain
UNION ALL SELECT 'platform', platform, count(*), count(*) FILTER (WHERE status = 'completed')
    FROM {T["task"]} WHERE status <> 'archived' GROUP BY platform
UNION ALL SELECT 'difficulty', difficulty::text, count(*), count(*) FILTER (WHERE status = 'completed')
    FROM {T["task"]} WHERE status <> 'archived' GROUP BY difficulty
UNION ALL SELECT 'trajectory_status', status, count(*), 0 FROM {T["traj"]} GROUP BY status
"""

BACKLOG_SQL = f"""
SELECT count(*), count(*) FILTER (WHERE EXISTS (
        SELECT 1 FROM {T["assign"]} a WHERE a.trajectory_id = t.id AND a.status = 'active')),
    min(coalesce(t.submitted_at, t.created_at))
FROM {T["traj"]} t WHERE t.status = 'submitted'
"""


def refresh(trigger: str = "beat") -> Refresh | None:
    """Recompute every aggregate; returns the finished Refresh, or None when another refresh holds the lock."""
    started, clock = timezone.now(), time.monotonic()
    outermost = not connection.in_atomic_block  # else (a test's transaction) the snapshot is the caller's
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if outermost:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
            if not cursor.fetchone()[0]:
                return None
            cursor.execute("SELECT now()")
            as_of = cursor.fetchone()[0]
            for table in ("a_stats", "a_through", "a_accept", "a_cover"):
                cursor.execute(f"DELETE FROM {T[table]}")
            cursor.execute(ANNOTATORS_SQL, {"pass": PASS})
            cursor.execute(THROUGHPUT_SQL)
            cursor.execute(ACCEPTANCE_SQL)
            cursor.execute(COVERAGE_SQL)
            cursor.execute(BACKLOG_SQL)
            unreviewed, assigned, oldest = cursor.fetchone()
            # Through the agreement cache: the beat refresh also keeps the agreement page and review queue warm.
            store_peer_agreement(agreement.pair_agreement(agreement.cached_task_agreements()))
            Refresh.objects.filter(started_at__lt=started - KEEP_HISTORY).delete()
            return Refresh.objects.create(
                status=Refresh.Status.DONE,
                trigger=trigger,
                started_at=started,
                as_of=as_of,
                duration_ms=round((time.monotonic() - clock) * 1000),
                backlog_unreviewed=unreviewed,
                backlog_assigned=assigned,
                backlog_oldest=oldest,
            )
    except Exception as exc:
        Refresh.objects.create(
            status=Refresh.Status.FAILED,
            trigger=trigger,
            started_at=started,
            duration_ms=round((time.monotonic() - clock) * 1000),
            error=f"{type(exc).__name__}: {exc}"[:2000],
        )
        raise


def peer_means(pairs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per annotator, from agreement.pair_agreement's rows: shared tasks and each measure's mean over their pairs,
    weighted by the pair's shared tasks (None where no pair has the measure)."""
    sums: dict[int, dict[str, list[float]]] = {}
    for row in pairs:
        for annotator_id in row["annotators"]:
            mine = sums.setdefault(annotator_id, {"tasks": [0.0, 0.0]} | {k: [0.0, 0.0] for k in PEER_MEASURES})
            mine["tasks"][0] += row["tasks"]
            for field, key in PEER_MEASURES.items():
                if row[key] is not None:
                    mine[field][0] += row[key] * row["tasks"]
                    mine[field][1] += row["tasks"]
    return {
        pk: {"peer_tasks": int(m["tasks"][0])}
        | {field: (m[field][0] / m[field][1] if m[field][1] else None) for field in PEER_MEASURES}
        for pk, m in sums.items()
    }


def store_peer_agreement(pairs: list[dict[str, Any]]) -> None:
    """Write peer_means(pairs) onto the annotators' rows (the peers that have no row of their own are skipped)."""
    for annotator_id, values in peer_means(pairs).items():
        AnnotatorStats.objects.filter(annotator_id=annotator_id).update(**values)


def latest() -> Refresh | None:
    """The newest finished refresh: the snapshot the dashboard shows."""
    return Refresh.objects.filter(status=Refresh.Status.DONE).order_by("-as_of", "-id").first()
