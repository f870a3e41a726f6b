"""Gold tasks: tasks with a known verifier and answer, mixed into annotators' queues at their project's gold rate,
so every annotator gets an accuracy score without being able to tell which tasks are gold.

The queue (annotation_app.task_queue) asks `gold_filter(draw(annotator, n))` at each hand-out: the draw is a hash of
(annotator, how many tasks they were handed before), uniform in [0, 1), so the share of gold hand-outs follows the
rate without a pattern an annotator could count, and a test can predict it. Gold accuracy is the mean verifier
outcome (Trajectory.outcome_reward) of an annotator's finished trajectories on gold tasks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from django.db.models import Avg, Count, Q

from .models import ProjectSettings, Trajectory

DEFAULT_GOLD_RATE: float = ProjectSettings._meta.get_field("gold_rate").get_default()
MAX_REQUIRED_ANNOTATIONS = 20
FINISHED = (Trajectory.Status.SUBMITTED, Trajectory.Status.APPROVED, Trajectory.Status.REJECTED)


class OverlapRefused(ValueError):
    """A lead's change to a task's k or gold flag is refused (the message says why)."""


def draw(annotator_id: int, handed_out: int) -> float:
    """A uniform number in [0, 1) for the annotator's next hand-out: deterministic, without a visible pattern."""
    digest = hashlib.blake2b(f"gold:{annotator_id}:{handed_out}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def gold_rates() -> dict[str, float]:
    """Each configured project's gold rate (projects without a ProjectSettings row use DEFAULT_GOLD_RATE)."""
    return dict(ProjectSettings.objects.values_list("project", "gold_rate"))


def gold_filter(u: float, rates: dict[str, float] | None = None) -> Q | None:
    """The gold tasks a hand-out with draw `u` may take (those of projects whose rate is above u), or None."""
    rates = gold_rates() if rates is None else rates
    below = [project for project, rate in rates.items() if rate <= u]
    if DEFAULT_GOLD_RATE > u:
        return Q(is_gold=True) & ~Q(project__in=below)
    above = [project for project, rate in rates.items() if rate > u]
    return Q(is_gold=True, project__in=above) if above else None


def gold_accuracy(annotator_ids: Iterable[int] | None = None) -> dict[int, float | None]:
    """Mean verifier outcome of each annotator's finished gold-task trajectories: {annotator id: 0..1}.

    None for an annotator asked about who has no scored gold trajectory yet; with no ids, every annotator with a
    finished gold trajectory is listed."""
    rows = Trajectory.objects.filter(task__is_gold=True, status__in=FINISHED, annotator__isnull=False)
    if annotator_ids is not None:
        annotator_ids = list(annotator_ids)
        rows = rows.filter(annotator_id__in=annotator_ids)
    means = dict(
        rows.values("annotator_id")
        .annotate(mean=Avg("outcome_reward"), n=Count("outcome_reward"))
        .values_list("annotator_id", "mean")
    )
    ids = annotator_ids if annotator_ids is not None else sorted(means)
    return {pk: (float(means[pk]) if means.get(pk) is not None else None) for pk in ids}
