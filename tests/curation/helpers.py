"""Trajectories with real screenshots for the curation tests: drawn pictures (PIL), stored in the test's media."""

from __future__ import annotations

import hashlib
import io
import random

from django.core.files.base import ContentFile
from PIL import Image, ImageDraw, ImageOps

from annotation_app.models import Step, Task, Trajectory

from ..factories import StepFactory, TrajectoryFactory


def picture(seed: int, size: tuple[int, int] = (640, 400), fmt: str = "PNG", quality: int = 90) -> bytes:
    """A screen-like picture: a title bar and coloured boxes placed by `seed` (different seeds: different screens)."""
    rng = random.Random(seed)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, size[0], 30), fill=(40, 60, 120))
    for _ in range(6):
        x, y = rng.randrange(0, size[0] - 120), rng.randrange(40, size[1] - 80)
        w, h = rng.randrange(60, 200), rng.randrange(30, 120)
        draw.rectangle((x, y, x + w, y + h), fill=tuple(rng.randrange(0, 256) for _ in range(3)))
    return encode(image, fmt, quality)


def encode(image: Image.Image, fmt: str = "PNG", quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, quality=quality) if fmt == "JPEG" else image.save(out, fmt)
    return out.getvalue()


def reencoded(data: bytes, *, scale: float = 0.8, quality: int = 60) -> bytes:
    """The same screen as the recorder or the model might keep it: resized and saved as a lossy JPEG."""
    with Image.open(io.BytesIO(data)) as image:
        small = image.convert("RGB").resize((int(image.width * scale), int(image.height * scale)))
    return encode(small, "JPEG", quality)


def inverted(data: bytes) -> bytes:
    """A tampered screenshot: the picture's colours inverted (perceptually as far from it as can be)."""
    with Image.open(io.BytesIO(data)) as image:
        return encode(ImageOps.invert(image.convert("RGB")), "PNG")


def make_trajectory(
    task: Task, steps: list[tuple[str, bytes | None]], *, status: str = Trajectory.Status.SUBMITTED, **fields: object
) -> Trajectory:
    """A finished trajectory of `task` whose steps have these action texts and screenshots (None: no screenshot)."""
    trajectory = TrajectoryFactory(task=task, status=status, screen_width=1280, screen_height=800, **fields)
    for index, (action, shot) in enumerate(steps):
        step = StepFactory(trajectory=trajectory, index=index, action_text=action)
        if shot is not None:
            step.screenshot_sha256 = hashlib.sha256(shot).hexdigest()
            step.screenshot.save("step.png", ContentFile(shot), save=False)
            step.save()
    return trajectory


def flags_of(trajectory: Trajectory, kind: str) -> list[dict]:
    trajectory.refresh_from_db()
    return [f for f in trajectory.flags if f.get("kind") == kind]


def step(trajectory: Trajectory, index: int) -> Step:
    return trajectory.steps.get(index=index)
