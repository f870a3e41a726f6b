"""Grounding drills: synthetic one-turn, text-only episodes that teach a from-scratch agent to click the outline line an
instruction names. Each drill is an instruction quoting one of 2-6 labels, a page outline listing them, and the reply
that clicks the named line, in the agent's own format (`Thought: I click <line>.` then the click at its centre).

Why: trained on the flywheel's few hundred episodes, the suite agent (training/agent.py) learns a task's flow but picks
among elements at chance (bench/grounding.py). Finding the named line is an induction pattern that its 3-layer decoder
learns only after tens of thousands of examples (docs/agent.md, "Does it ground?"). The labels come from the task
suite's word pools (sandbox/suite/words.py), so the drills share the suite's vocabulary but none of its pages,
instances, positions or flows. Random letter strings did not learn within 1,600 steps of 32.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.actions import Click, Point, format_action
from sandbox.outline import Element, line, render
from sandbox.suite.words import CATEGORIES, LABELS, WORDS
from training.data import Episode, write_episodes
from training.policy.prompts import COMPUTER_USE

DRILL_SOURCE = "drill"
POOL = tuple(sorted(set(LABELS) | set(WORDS) | {word for words in CATEGORIES.values() for word in words}))
ROLES = ("button", "checkbox", "radio", "option", "item", "link", "menuitem", "tab")
STATEFUL = ("checkbox", "radio")
PHRASES = (
    "Click the {role} labelled '{x}'.",
    "Click '{x}'.",
    "Tick the box labelled '{x}', and no other box.",
    "Choose '{x}' for {y}.",
    "Pick '{x}' from the {y} drop-down.",
    "Select '{x}'.",
    "Press the '{x}' {role}.",
)
FRAME = (1280, 810)  # where outline centres fall: inside the model image's frame of a 1280x800 screen
MARGIN = 10


def _element(role: str, label: str, checked: bool | None, x: int, y: int) -> Element:
    """An element of the drill's made-up page: a 2x2 box centred on (x, y), so its outline centre is (x, y)."""
    return Element(role=role, text=label, value=None, checked=checked, focused=False, x=x - 1, y=y - 1, w=2, h=2)


def drill(rng: random.Random, index: int = 0) -> Episode:
    """One drill: an instruction naming one of 2-6 elements of one role, the outline, and the click on the named one."""
    role = rng.choice(ROLES)
    labels = rng.sample(POOL, rng.randint(2, 6))
    target = rng.randrange(len(labels))
    instruction = rng.choice(PHRASES).format(x=labels[target], role=role, y=rng.choice(POOL))
    centres = [(rng.randint(MARGIN, FRAME[0] - MARGIN), rng.randint(MARGIN, FRAME[1] - MARGIN)) for _ in labels]
    checked = [rng.choice((True, False)) if role in STATEFUL else None for _ in labels]
    elements = [_element(role, label, c, x, y) for label, c, (x, y) in zip(labels, checked, centres, strict=True)]
    x, y = centres[target]
    reply = f"Thought: I click {line(elements[target])}.\nAction: {format_action(Click(point=Point(x, y)))}"
    return Episode(
        messages=[
            {"role": "user", "content": COMPUTER_USE.format(language="English", instruction=instruction)},
            {"role": "user", "content": [{"type": "text", "text": render(elements)}]},
            {"role": "assistant", "content": reply},
        ],
        id=f"drill-{index}",
        reward=1.0,
        source=DRILL_SOURCE,
        instruction=instruction,
    )


def drills(count: int, seed: int = 0) -> list[Episode]:
    """`count` drills drawn from `seed` (the same seed gives the same drills)."""
    rng = random.Random(seed)
    return [drill(rng, n) for n in range(count)]


def drill_agent(model: str | Path, out: str | Path, *, count: int = 32_000, seed: int = 0, batch: int = 32,
                lr: float = 3e-3, progress: bool = True, sft: Callable[..., dict[str, Any]] | None = None,
                on_progress: Callable[[int], None] | None = None) -> Path:  # fmt: skip
    """Train `model` on `count` drills (one pass, `batch` a step) and write the result to `out`/final; returns it.
    Kept as it is when `out`/final already exists (the drills are fixed by `seed`). `on_progress` hears the number
    of drills trained after each step (for a caller's own progress display)."""
    from training.sft import SFTConfig, train_sft

    if batch < 1 or count < batch:
        raise ValueError(f"drills: {count} drills are not at least one batch of {batch}")
    out = Path(out)
    final = out / "final"
    if (final / "model.safetensors").is_file():
        return final
    data = out / "drills.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    write_episodes(data, drills(count, seed))
    config = SFTConfig(model=str(model), data=str(data), out=str(out / "run"), lr=lr, warmup_steps=20,
                       batch_episodes=batch, micro_batch=batch, max_length=1024, seed=seed, keep=1,
                       progress=progress)  # fmt: skip
    on_step = None if on_progress is None else lambda step, metrics: on_progress(int(metrics["episodes"]))
    (sft or train_sft)(config, on_step)
    (out / "run" / "final").rename(final)
    data.unlink()
    return final
