"""Shared by the training-stage tests: SFT-worthy trajectories, a tiny Qwen2.5-VL base model in the registry, and
waiting on an iteration."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

from django.core.files.storage import default_storage

from annotation_app.models import Step, Task, Trajectory
from flywheel.models import Iteration, ModelVersion

from .helpers import png

ACTIONS = ["click(start_box='<|box_start|>(100,80)<|box_end|>')", "type(content='hello')", "hotkey(key='ctrl s')"]


def sft_trajectories(n: int, *, steps: int = 2, screen: tuple[int, int] = (320, 200)) -> list[Trajectory]:
    """`n` finished trajectories the verifier passed: V routes them to the SFT store."""
    task = Task.objects.create(instruction="Save the file", domain="os")
    shot = default_storage.save("tests/flywheel/train.png", io.BytesIO(png(*screen)))
    made = []
    for _ in range(n):
        trajectory = Trajectory.objects.create(
            task=task,
            mode=Trajectory.Mode.ROLLOUT,
            status=Trajectory.Status.SUBMITTED,
            outcome_reward=1.0,
            screen_width=screen[0],
            screen_height=screen[1],
        )
        Step.objects.bulk_create(
            [
                Step(trajectory=trajectory, index=i, thought="Next.", action_text=ACTIONS[i % 3], screenshot=shot)
                for i in range(steps)
            ]
        )
        made.append(trajectory)
    return made


def tiny_base(path: Path, name: str = "tiny-base") -> ModelVersion:
    """The tiny Qwen2.5-VL built from a config (no download), registered as a base model."""
    from training.policy.tiny import build_tiny_checkpoint

    checkpoint = path if (path / "config.json").exists() else build_tiny_checkpoint(path)
    return ModelVersion.objects.create(name=name, checkpoint_uri=str(checkpoint))


def wait_for(pk: int, done: Callable[[Iteration], bool], timeout: float = 300, log: Path | None = None) -> Iteration:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        iteration = Iteration.objects.get(pk=pk)
        if done(iteration):
            return iteration
        time.sleep(0.3)
    tail = log.read_text()[-4000:] if log and log.exists() else ""
    raise AssertionError(f"iteration {pk} stuck: {Iteration.objects.get(pk=pk).stages}\n{tail}")


def long_sft(steps: int = 400, nproc: int = 1) -> dict:
    """Trainer options for an SFT run long enough to interrupt: one episode a process and step, a checkpoint every
    step."""
    sft = {"batch_episodes": nproc, "epochs": 200, "max_steps": steps, "save_every": 1}
    return {"preset": "tiny-cpu", "nproc": nproc, "sft": sft}
