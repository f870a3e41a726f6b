"""Two workers on this machine, as on two hosts: one takes the `flywheel` queue (validation, export), the other
`train,sandbox` (training, evaluation, RFT). One iteration runs through both, each stage on its own queue's worker,
neither worker waiting on the other's queue."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flywheel.iterations import start_iteration
from flywheel.models import Iteration, ModelVersion

from ..servers import running, subprocess_env
from .train_helpers import sft_trajectories, tiny_base, wait_for


@contextmanager
def worker_on(queues: str, name: str, log: Path, **env: str) -> Iterator[Path]:
    """A `celery worker` subprocess consuming only `queues`, pointed at pytest's test database."""
    from annotation_app.celery import app

    node = f"{name}-{os.getpid()}@localhost"
    command = [sys.executable, "-m", "celery", "-A", "annotation_app", "worker", "--pool", "solo", "--loglevel", "INFO"]
    command += ["-Q", queues, "--without-gossip", "--without-mingle", "-n", node]

    def ready() -> bool:
        return any(node in reply for reply in app.control.ping(destination=[node], timeout=0.5))

    with running(command, subprocess_env(**env), log, ready):
        yield log


def test_one_iteration_runs_across_a_flywheel_worker_and_a_train_worker(media, transactional_db, tmp_path):
    from annotation_app.celery import app

    sft_trajectories(3)
    base = tiny_base(tmp_path / "tiny")
    env = {"FLYWHEEL_RUNS_ROOT": str(tmp_path / "runs")}
    app.control.purge()
    with (
        worker_on("flywheel", "fly", tmp_path / "flywheel.log", **env) as fly_log,
        worker_on("train,sandbox", "gpu", tmp_path / "train.log", **env) as train_log,
    ):
        iteration = start_iteration(
            None, base_model=base, stages=["validate", "export", "sft"],
            config={"v": {"threshold": 0.5}, "train": {"preset": "tiny-cpu"}},
        )  # fmt: skip
        done = wait_for(iteration.pk, lambda i: i.finished, log=train_log)
    assert done.status == Iteration.Status.SUCCEEDED, (done.error, fly_log.read_text()[-2000:])
    assert done.stages["sft"]["queue"] == "train" and done.stages["sft"]["output"]["model_id"]
    assert ModelVersion.objects.filter(iteration=iteration).count() == 1
    fly, train = fly_log.read_text(), train_log.read_text()  # "Task <name>[<id>] received" per message taken
    assert "Task flywheel.run_iteration[" in fly and "Task training.flywheel_stage[" not in fly
    assert "Task training.flywheel_stage[" in train and "Task flywheel.run_iteration[" not in train
