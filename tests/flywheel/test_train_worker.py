"""Training stages on a real Celery worker: cancel kills the trainer's whole process group; a worker killed with
SIGKILL mid-training takes its trainer with it, the stall check queues the iteration again, and a new worker resumes
the trainer from its checkpoint and finishes the iteration with nothing duplicated."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.urls import reverse

from flywheel.iterations import requeue_stalled, start_iteration
from flywheel.models import DatasetVersion, Iteration, ModelVersion, Validation
from flywheel.subprocesses import group_members, tree

from ..conftest import api_client_for, celery_worker
from .train_helpers import long_sft, sft_trajectories, tiny_base, wait_for


@pytest.fixture
def runs(tmp_path) -> Path:
    return tmp_path / "runs"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def _gone(pgid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_members(pgid) and not _alive(pgid):
            return True
        time.sleep(0.2)
    return False


def _training(iteration: Iteration, at_least: int = 1) -> bool:
    entry = iteration.stages.get("sft", {})
    return entry.get("status") == "running" and entry.get("done", 0) >= at_least and bool(entry.get("pgid"))


@pytest.mark.parametrize("nproc", [1, 2])
def test_cancel_kills_the_trainers_process_group(nproc, media, runs, transactional_db, tmp_path, make_user):
    """With nproc 2 the group is torchrun and its two ranks: all of them go."""
    sft_trajectories(3)
    base = tiny_base(tmp_path / "tiny")
    engineer = make_user("ml_engineer")
    with celery_worker(tmp_path / "worker.log", FLYWHEEL_RUNS_ROOT=str(runs)) as log:
        iteration = start_iteration(
            engineer, base_model=base, stages=["validate", "export", "sft"],
            config={"v": {"threshold": 0.5}, "train": long_sft(nproc=nproc)},
        )  # fmt: skip
        running = wait_for(iteration.pk, lambda i: _training(i) or i.finished, log=log)
        assert not running.finished, running.error
        pgid = running.stages["sft"]["pgid"]
        trainers = tree(pgid)  # with torchrun: the launcher and its ranks (in sessions of their own)
        assert pgid in group_members(pgid) and len(trainers) >= (1 if nproc == 1 else 1 + nproc), trainers
        assert ("torch.distributed.run" in running.stages["sft"]["command"]) == (nproc > 1)
        response = api_client_for(engineer).post(reverse("flywheel-iteration-cancel", args=[iteration.pk]))
        assert response.status_code in (200, 202), response.content
        cancelled = wait_for(iteration.pk, lambda i: i.finished, log=log)
    assert cancelled.status == Iteration.Status.CANCELLED, cancelled.error
    assert cancelled.stages["sft"]["status"] == "cancelled"
    assert _gone(pgid), f"trainer group {pgid} still runs: {group_members(pgid)}"
    assert not [pid for pid in trainers if _alive(pid)], "every trainer process is gone"
    assert not ModelVersion.objects.filter(iteration=iteration).exists()


def test_a_worker_killed_mid_training_ends_in_a_finished_iteration_with_nothing_duplicated(
    media, runs, transactional_db, tmp_path
):
    from annotation_app.celery import app

    trajectories = sft_trajectories(3)
    base = tiny_base(tmp_path / "tiny")
    config = {"v": {"threshold": 0.5}, "train": long_sft(steps=6)}
    env = {"FLYWHEEL_RUNS_ROOT": str(runs)}
    with celery_worker(tmp_path / "worker1.log", **env) as log:
        pid = next(iter(app.control.inspect(timeout=2).stats().values()))["pid"]
        iteration = start_iteration(None, base_model=base, stages=["validate", "export", "sft"], config=config)
        running = wait_for(iteration.pk, lambda i: _training(i, at_least=2), log=log)
        pgid = running.stages["sft"]["pgid"]
        os.kill(pid, signal.SIGKILL)
        assert _gone(pgid), "the trainer dies with its worker (PR_SET_PDEATHSIG)"
    killed = Iteration.objects.get(pk=iteration.pk)
    assert killed.status == Iteration.Status.RUNNING and killed.stages["sft"]["status"] == "running"
    assert requeue_stalled(3600) == []  # beaten recently: not stalled yet
    with celery_worker(tmp_path / "worker2.log", **env) as log:
        time.sleep(1.5)
        assert requeue_stalled(1.0) == [iteration.pk]  # what the beat task does after FLYWHEEL_STALL_S
        done = wait_for(iteration.pk, lambda i: i.finished, log=log)
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    entry = done.stages["sft"]
    assert entry["attempts"] == 2 and entry["output"]["resumed"] is True
    steps = [row["step"] for row in entry["metrics"]]
    assert steps == list(range(1, 7)) and entry["done"] == 6
    assert ModelVersion.objects.filter(iteration=iteration).count() == 1
    assert DatasetVersion.objects.filter(iteration=iteration).count() == 1
    ids = list(Validation.objects.filter(iteration=iteration).values_list("trajectory_id", flat=True))
    assert sorted(ids) == sorted(t.pk for t in trajectories)
