"""Simulated annotators (issue 16): programs that do live interactive annotation through the real HTTP API.

A simulated annotator is a `User` with `is_simulated=True` and an API token. `annotate_tasks` drives the live API as a
script would (POST /api/live/ naming the task, poll the state for the model's proposals, GET the session's oracle
state, POST a step), accepting a proposal when `sandbox.suite.accepts` says it does what the suite's oracle would do
and overriding it with the oracle's action otherwise: the on-policy corrections of the UI-TARS-2 report, §2.4.2.
`acceptance` sums what was accepted from the stored steps. Their trajectories are marked `simulated`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .models import Task, User

Progress = Callable[[dict[str, Any]], None]


def simulated_annotators(n: int) -> list[User]:
    """`n` simulated annotators named sim-annotator-1 … sim-annotator-n (created once, reused after), with tokens."""
    raise NotImplementedError


def annotate_tasks(
    base_url: str,
    tasks: Sequence[Task | int],
    annotators: Sequence[User],
    *,
    seed: int,
    mistake_rate: float = 0.0,
    max_steps: int = 15,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Annotate every suite task live through the web stack at `base_url` (e.g. http://127.0.0.1:8000), spread over
    `annotators` (one thread each, each one task at a time); an active annotation model must be promoted first.

    Per step: accept the first valid proposal the oracle agrees with, else override with the oracle's action; with
    probability `mistake_rate` (drawn from `seed`, the task and the step) override with the family's wrong action
    instead. A trajectory ends when the oracle says finished (the step is a `finished()`, so the task's verifier
    scores it) or is abandoned after `max_steps`. `progress`, when given, is called after each trajectory with its
    result. Returns one dict per task, in the order given: trajectory (id), task (id), annotator (username), steps,
    accepted, overridden, mistakes, end_reason, outcome (the verifier's score, None when it was not scored), error
    (why a task could not be annotated, "" otherwise)."""
    raise NotImplementedError


def acceptance(trajectory_ids: Sequence[int]) -> dict[str, Any]:
    """How the annotators treated the model's proposals in these trajectories, from the stored steps: accepted (a
    candidate chosen as-is), overridden (candidates shown, the annotator's own action taken), total (steps with
    candidates) and rate (accepted / total, None without candidates)."""
    raise NotImplementedError
