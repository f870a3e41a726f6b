"""The bundled verifiable task suite: seeded families of browser and desktop tasks with verifiers and oracles.

API: `families()`, `make_task(family, seed, split, difficulty)`, `oracle_action(family, task, state)`; `state` is
what `run.read_state` reads from a session. See docs/task-suite.md."""

from __future__ import annotations

from typing import Any

from . import apps, web_basic, web_multi  # noqa: F401  (they register the families)
from .core import REGISTRY, SPLITS, Split, family, instance, make_task, seeds, spec_of, split_of, task_id
from .judge import agrees

__all__ = [
    "SPLITS", "Split", "accepts", "agrees", "families", "family", "instance", "make_task", "oracle_action", "seeds",
    "spec_of", "split_of", "suite_tasks", "task_id", "wrong_action",
]  # fmt: skip


def families() -> list[str]:
    """Names of every family, in registration order."""
    return list(REGISTRY)


def oracle_action(name: str, task: Any, state: dict[str, Any]) -> str:
    """A correct next UI-TARS action (screen pixels) for the task in `state`; finished() when it is done."""
    fam, spec = spec_of(task)
    if fam.name != name:
        raise ValueError(f"the task belongs to family {fam.name!r}, not {name!r}")
    return fam.oracle(spec, state)


def accepts(name: str, task: Any, state: dict[str, Any], proposed: str) -> bool:
    """Whether a simulated annotator accepts `proposed` (action text, screen pixels): it does what the oracle's
    next action does in `state` (same element, text, keys or direction; see judge.py)."""
    return agrees(oracle_action(name, task, state), proposed, state)


def wrong_action(name: str, task: Any, state: dict[str, Any]) -> str:
    """A plausible wrong action (a distractor or a wrong value), for tests and imperfect simulated annotators."""
    fam, spec = spec_of(task)
    if fam.name != name:
        raise ValueError(f"the task belongs to family {fam.name!r}, not {name!r}")
    return fam.wrong(spec, state)


def suite_tasks(
    names: list[str] | None = None, train: int = 20, heldout: int = 5, levels: list[int] | None = None
) -> list[dict[str, Any]]:
    """Tasks of `names` (default: all): the first `train` and `heldout` seeds of each split, at each of the family's
    difficulty levels (or those of `levels` it has)."""
    tasks = []
    for name in names or families():
        fam = family(name)
        for difficulty in [d for d in fam.levels if levels is None or d in levels]:
            for split, count in (("train", train), ("heldout", heldout)):
                tasks += [make_task(name, seed, split, difficulty) for seed in seeds(split, count)]  # type: ignore[arg-type]
    return tasks
