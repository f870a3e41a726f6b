"""The suite's registry and task format: families, seeds and their split, and tasks as the platform imports them."""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")
HELDOUT_EVERY = 5  # every fifth seed (0, 5, 10, ...) is held out: training never sees those instances


def split_of(seed: int) -> Split:
    """The split a seed belongs to; fixed by the seed alone, so the two sets of seeds never overlap."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"a seed is a non-negative integer, got {seed!r}")
    return "heldout" if seed % HELDOUT_EVERY == 0 else "train"


def seeds(split: Split, count: int, start: int = 0) -> list[int]:
    """The first `count` seeds of `split`, from `start` on."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    out, seed = [], start
    while len(out) < count:
        if split_of(seed) == split:
            out.append(seed)
        seed += 1
    return out


class Family:
    """One task family: instances drawn from a seed, their setup and verifier, and an oracle over observed state.

    Subclasses set `name`, `platform`, `levels` and implement `generate`, `instruction`, `setup`, `evaluator`,
    `oracle` and `wrong`. `state` is what `probe` reads from the session (see run.read_state)."""

    name: ClassVar[str]
    platform: ClassVar[Literal["browser", "desktop"]]
    app: ClassVar[str] = "chromium"
    levels: ClassVar[tuple[int, ...]] = (1,)
    summary: ClassVar[str] = ""

    def generate(self, rng: random.Random, difficulty: int) -> dict[str, Any]:
        """The instance's ground truth (labels, positions, distractors, the answer)."""
        raise NotImplementedError

    def instruction(self, spec: dict[str, Any]) -> str:
        raise NotImplementedError

    def setup(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        """OSWorld `config` steps that put the session in the task's starting state."""
        raise NotImplementedError

    def evaluator(self, spec: dict[str, Any]) -> dict[str, Any]:
        """OSWorld evaluator that scores the session's final state 1 or 0."""
        raise NotImplementedError

    def oracle(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        """A correct next UI-TARS action (screen pixels) in `state`; finished() once the task is done."""
        raise NotImplementedError

    def wrong(self, spec: dict[str, Any], state: dict[str, Any]) -> str:
        """A plausible but wrong action (a distractor, a wrong value), for tests and imperfect simulated annotators."""
        raise NotImplementedError


REGISTRY: dict[str, Family] = {}


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: add one instance of the family to the registry under its name."""
    if cls.name in REGISTRY:
        raise ValueError(f"family {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls()
    return cls


def family(name: str) -> Family:
    if name not in REGISTRY:
        raise ValueError(f"unknown task family {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def instance(name: str, seed: int, difficulty: int) -> dict[str, Any]:
    """The ground truth of one instance: the same (family, seed, difficulty) always gives the same instance."""
    fam = family(name)
    if difficulty not in fam.levels:
        raise ValueError(f"family {name!r} has difficulty levels {list(fam.levels)}, got {difficulty!r}")
    split_of(seed)
    return fam.generate(random.Random(f"suite:{name}:{seed}:{difficulty}"), difficulty)


def task_id(name: str, seed: int, difficulty: int) -> str:
    return f"suite-{name}-{split_of(seed)}-s{seed}-d{difficulty}"


def make_task(name: str, seed: int, split: Split, difficulty: int = 1) -> dict[str, Any]:
    """One instance as a platform task (the importer's format, OSWorld's config and evaluator)."""
    if split_of(seed) != split:
        raise ValueError(f"seed {seed} belongs to the {split_of(seed)} split, not {split!r}")
    fam = family(name)
    spec = instance(name, seed, difficulty)
    return {
        "id": task_id(name, seed, difficulty),
        "instruction": fam.instruction(spec),
        "platform": fam.platform,
        "domain": f"suite-{name}",
        "related_apps": [fam.app],
        "difficulty": difficulty,
        "config": fam.setup(spec),
        "evaluator": fam.evaluator(spec),
        "metadata": {"suite": name, "seed": seed, "split": split, "difficulty": difficulty},
    }


def spec_of(task: Any) -> tuple[Family, dict[str, Any]]:
    """The family and ground truth of a suite task: a task dict, or anything with its `metadata` (an imported Task
    row); only the metadata is read."""
    meta = (task.get("metadata") if isinstance(task, dict) else getattr(task, "metadata", None)) or {}
    if not isinstance(meta, dict) or "suite" not in meta:
        raise ValueError("not a suite task: its metadata has no 'suite'")
    return family(meta["suite"]), instance(meta["suite"], int(meta["seed"]), int(meta["difficulty"]))
