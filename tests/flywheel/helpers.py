"""Populations of trajectories for the flywheel tests, made in bulk (a handful of queries whatever their size)."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field

from django.core.files.storage import default_storage
from django.utils import timezone

from annotation_app.models import Capture, Review, Step, Task, Trajectory, User

ACTIONS = [
    "click(start_box='<|box_start|>(640,400)<|box_end|>')",
    "type(content='hello\\n')",
    "hotkey(key='ctrl s')",
    "scroll(start_box='<|box_start|>(10,790)<|box_end|>', direction='down')",
    "drag(start_box='<|box_start|>(0,0)<|box_end|>', end_box='<|box_start|>(1279,799)<|box_end|>')",
    "finished(content='done')",
]
BROKEN = ["clik(start_box='(1,2)')", "click(start_box='(1,2)'", "type(content=nope)"]


@dataclass
class Population:
    trajectories: list[Trajectory] = field(default_factory=list)
    in_scope: set[int] = field(default_factory=set)  # finished (not in progress)
    broken: set[int] = field(default_factory=set)


def png(width: int, height: int, colour: tuple[int, int, int] = (30, 120, 200)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, format="PNG")
    return out.getvalue()


def population(
    rng: random.Random,
    n: int,
    *,
    steps: tuple[int, int] = (1, 6),
    annotator: User | None = None,
    reviewer: User | None = None,
    domains: tuple[str, ...] = ("chrome", "libreoffice_calc", "os"),
    screenshots: bytes | None = None,
) -> Population:
    """`n` random trajectories: modes, statuses, rewards, reviews, capture flags and some broken ones."""
    tasks = Task.objects.bulk_create([Task(instruction=f"Task in {d}", domain=d) for d in domains])
    trajectories = [
        Trajectory(
            task=rng.choice(tasks),
            annotator=annotator,
            mode=rng.choice(Trajectory.Mode.values),
            status=rng.choice(Trajectory.Status.values),
            outcome_reward=rng.choice([None, 0.0, 1.0, 0.5]),
            screen_width=1280,
            screen_height=800,
            submitted_at=timezone.now(),
        )
        for _ in range(n)
    ]
    Trajectory.objects.bulk_create(trajectories)
    pop = Population(trajectories=trajectories)
    shot = ""
    if screenshots is not None:
        shot = default_storage.save("tests/flywheel/shot.png", io.BytesIO(screenshots))
    step_rows: list[Step] = []
    for t in trajectories:
        if t.status not in (Trajectory.Status.IN_PROGRESS, Trajectory.Status.ABANDONED):  # unfinished: out of scope
            pop.in_scope.add(t.pk)
        count = rng.randint(*steps)
        broken = rng.random() < 0.15
        if broken or count == 0:
            pop.broken.add(t.pk)
        bad = rng.randrange(max(count, 1)) if broken else -1
        kind = rng.choice(["action", "screenshot"])
        for i in range(count):
            action = rng.choice(ACTIONS)
            screenshot = shot or f"trajectories/{t.pk}/steps/{i:05d}.png"
            if i == bad and kind == "action":
                action = rng.choice(BROKEN)
            if i == bad and kind == "screenshot":
                screenshot = ""
            step_rows.append(
                Step(trajectory=t, index=i, action_text=action, screenshot=screenshot, thought=rng.choice(["", "Go."]))
            )
    Step.objects.bulk_create(step_rows)
    if reviewer is not None:
        reviewed = [t for t in trajectories if t.status in (Trajectory.Status.APPROVED, Trajectory.Status.REJECTED)]
        Review.objects.bulk_create(
            [
                Review(
                    trajectory=t,
                    reviewer=reviewer,
                    verdict="approve" if t.status == Trajectory.Status.APPROVED else "reject",
                    score=rng.choice([None, 1, 3, 4, 5]),
                )
                for t in reviewed
            ]
        )
    if annotator is not None:
        import uuid

        Capture.objects.bulk_create(
            [
                Capture(
                    annotator=annotator,
                    session_id=uuid.uuid4(),
                    size=1,
                    sha256="0" * 64,
                    trajectory=t,
                    flags=rng.choice([[], ["near_duplicate:1"], ["no_speech"]]),
                )
                for t in trajectories
                if t.mode == Trajectory.Mode.IN_SITU
            ]
        )
    return pop
