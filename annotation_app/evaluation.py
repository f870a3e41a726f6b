"""A finished trajectory's outcome: the task's evaluator run in its sandbox before the desktop is released.

The score goes to `Trajectory.outcome_reward` (the flywheel's validation reads it) and the record of how it was
obtained to `Trajectory.metadata["evaluation"]`: which metrics ran, on which last action, how long it took, or why
there is no score (no evaluator, or the evaluator failed). A missing score is never a silent null.
"""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone

from sandbox.client import SandboxClient, SandboxError

from .models import Trajectory


def _metrics(evaluator: dict[str, Any]) -> list[str]:
    func = evaluator.get("func")
    return [str(f) for f in func] if isinstance(func, list) else [str(func)] if func else []


def evaluate_trajectory(
    client: SandboxClient, session_id: str, trajectory: Trajectory, last_action: str | None
) -> dict[str, Any]:
    """Run the task's evaluator in `session_id` and store the outcome on `trajectory`; returns the record."""
    evaluator = trajectory.task.evaluator or {}
    record: dict[str, Any] = {"at": timezone.now().isoformat(), "last_action": last_action}
    score: float | None = None
    if not evaluator:
        record.update(status="no_evaluator", message="This task has no evaluator: there is no outcome score.")
    else:
        record["metrics"] = _metrics(evaluator)
        started = time.perf_counter()
        try:
            score = float(client.evaluate(session_id, evaluator, last_action=last_action))
        except SandboxError as exc:
            record.update(status="error", message=f"The evaluator could not run: {exc.detail}")
        else:
            record.update(status="scored", score=score, message="Success" if score >= 1.0 else "Not successful")
        record["seconds"] = round(time.perf_counter() - started, 3)
    trajectory.metadata = {**trajectory.metadata, "evaluation": record}
    trajectory.outcome_reward = score
    Trajectory.objects.filter(pk=trajectory.pk).update(metadata=trajectory.metadata, outcome_reward=score)
    return record
