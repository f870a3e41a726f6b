"""Training stages as the trainer's CLI in a child process: progress and metrics from its metrics.jsonl, the result
registered; a failing trainer fails the iteration with its log's end, and a resume skips the stages done. The starting
checks refuse stage combinations that cannot run."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from annotation_app.models import Task
from flywheel.iterations import (
    IterationError,
    cancel_iteration,
    iteration_lock,
    reopen_iteration,
    requeue_stalled,
    run_iteration,
    run_remote_stage,
    start_iteration,
)
from flywheel.locks import advisory_lock
from flywheel.models import DatasetVersion, Iteration, ModelVersion
from flywheel.training_stages import check_train_config, training_command

from .train_helpers import sft_trajectories, tiny_base

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(settings, tmp_path):
    settings.FLYWHEEL_RUNS_ROOT = tmp_path / "runs"
    return settings.FLYWHEEL_RUNS_ROOT


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    from training.policy.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny")


CONFIG = {"v": {"threshold": 0.5}, "train": {"preset": "tiny-cpu"}}
SFT_ONLY = ["validate", "export", "sft"]


def test_sft_runs_the_trainer_cli_and_records_progress_metrics_and_the_model(media, runs, tiny_path):
    sft_trajectories(4)
    base = tiny_base(tiny_path)
    iteration = start_iteration(None, base_model=base, stages=SFT_ONLY, config=CONFIG, enqueue=False)
    done = run_iteration(iteration.pk, remote=False)
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    entry = done.stages["sft"]
    assert entry["command"][1:4] == ["-m", "training", "sft"] and "--data" in entry["command"]
    assert entry["run_dir"] == str(runs / f"iteration-{iteration.pk}" / "sft")
    steps = [row["step"] for row in entry["metrics"]]
    assert steps == sorted(set(steps)) and steps[-1] == entry["done"] >= 1
    assert all("loss" in row for row in entry["metrics"])
    assert entry["total"] in (None, entry["done"]) or entry["total"] >= entry["done"]
    assert entry["log_tail"] and entry["heartbeat"]
    output = entry["output"]
    assert Path(output["checkpoint"], "config.json").exists() and output["resumed"] is False
    model = ModelVersion.objects.get(pk=output["model_id"])
    assert model.checkpoint_uri == output["checkpoint"] and model.parent == base
    sft_version = DatasetVersion.objects.get(iteration=iteration, kind="sft")
    data = Path(entry["command"][entry["command"].index("--data") + 1])
    assert sorted(p.name for p in data.glob("*.jsonl")) == sorted(
        f["path"] for f in sft_version.manifest["files"] if f["role"] == "episodes"
    )
    assert not list(runs.glob("*/sft/trainer/.checkpoint-*"))  # no half checkpoint left


def test_a_failing_trainer_fails_the_iteration_with_its_log_and_a_resume_skips_the_stages_done(media, runs, tiny_path):
    sft_trajectories(2)
    base = ModelVersion.objects.create(name="missing", checkpoint_uri=str(runs / "no-such-model"))
    iteration = start_iteration(None, base_model=base, stages=SFT_ONLY, config=CONFIG, enqueue=False)
    failed = run_iteration(iteration.pk, remote=False)
    assert failed.status == Iteration.Status.FAILED
    assert "exited with" in failed.error and "the log ends" in failed.error
    assert failed.stages["validate"]["status"] == failed.stages["export"]["status"] == "done"
    exported_at = failed.stages["export"]["finished_at"]
    ModelVersion.objects.filter(pk=base.pk).update(checkpoint_uri=str(tiny_path))
    reopen_iteration(failed)
    done = run_iteration(iteration.pk, remote=False)
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    assert done.stages["export"]["finished_at"] == exported_at  # not run again
    assert DatasetVersion.objects.filter(iteration=iteration).count() == 1
    assert done.stages["sft"]["attempts"] == 2 and done.stages["sft"]["status"] == "done"
    assert ModelVersion.objects.filter(iteration=iteration).count() == 1


def test_the_command_follows_the_model_chain_and_the_preset(media, runs, tiny_path):
    base = tiny_base(tiny_path)
    Task.objects.create(instruction="t", evaluator={"func": "exact_match"}, metadata={})
    config = {**CONFIG, "train": {"preset": "tiny-cpu", "nproc": 2, "ppo": {"iterations": 3}}}
    iteration = start_iteration(
        None, base_model=base, stages=["validate", "export", "sft", "value", "ppo"], config=config, enqueue=False
    )
    ppo = training_command(iteration, "ppo", resume=True)
    assert "torch.distributed.run" in ppo and "--nproc-per-node=2" in ppo
    sft_final = str(runs / f"iteration-{iteration.pk}" / "sft" / "trainer" / "final")
    critic = str(runs / f"iteration-{iteration.pk}" / "value" / "trainer" / "critic")
    assert ppo[ppo.index("--model") + 1] == sft_final and ppo[ppo.index("--critic") + 1] == critic
    assert ppo[ppo.index("--iterations") + 1] == "3" and "--resume" in ppo and "--no-progress" in ppo
    assert ppo[ppo.index("--env") + 1] == "sandbox" and Path(ppo[ppo.index("--tasks") + 1]).exists()
    value = training_command(iteration, "value", resume=False)
    assert value[value.index("--model") + 1] == sft_final and "--no-resume" in value


def test_retraining_starts_the_chain_from_another_model_than_the_base(media, runs, tiny_path):
    """`train.start_from`: the chain's first stage starts from that model's checkpoint (the demonstration retrains
    its untrained agent on the whole store); the base model stays the iteration's base (RFT, lineage)."""
    base = tiny_base(tiny_path)
    start = ModelVersion.objects.create(name="untrained", checkpoint_uri="/models/untrained")
    DatasetVersion.objects.create(kind="sft", number=1, manifest={"root": "x", "files": []})
    config = {**CONFIG, "train": {"preset": "tiny-cpu", "start_from": start.pk}}
    iteration = start_iteration(None, base_model=base, stages=["sft"], config=config, enqueue=False)
    sft = training_command(iteration, "sft", resume=False)
    assert sft[sft.index("--model") + 1] == "/models/untrained" and iteration.base_model == base
    for bad, message in ((True, "must be a model id"), ("3", "must be a model id"), (10**9, "no model")):
        with pytest.raises(ValueError, match=message):
            check_train_config({"start_from": bad})


def test_store_since_trains_only_on_the_store_versions_made_since_then(media, runs, tiny_path):
    """`train.store_since`: the demonstration trains on its own data, not on what earlier runs left in the store."""
    base = tiny_base(tiny_path)

    def version(number: int, made: timedelta) -> DatasetVersion:
        files = [{"path": f"episodes-v{n:04d}.jsonl", "role": "episodes", "version": n} for n in range(1, number + 1)]
        made_version = DatasetVersion.objects.create(kind="sft", number=number, manifest={"root": "s", "files": files})
        DatasetVersion.objects.filter(pk=made_version.pk).update(created_at=timezone.now() - made)
        return made_version

    version(1, timedelta(days=2)), version(2, timedelta(days=1)), version(3, timedelta(hours=1))
    since = (timezone.now() - timedelta(hours=2)).isoformat()
    config = {**CONFIG, "train": {"preset": "tiny-cpu", "store_since": since}}
    iteration = start_iteration(None, base_model=base, stages=["sft"], config=config, enqueue=False)
    sft = training_command(iteration, "sft", resume=False)
    data = Path(sft[sft.index("--data") + 1])
    assert sorted(p.name for p in data.glob("*.jsonl")) == ["episodes-v0003.jsonl"]
    everything = start_iteration(None, base_model=base, stages=["sft"], config=CONFIG, enqueue=False)
    sft = training_command(everything, "sft", resume=False)
    assert len(list(Path(sft[sft.index("--data") + 1]).glob("*.jsonl"))) == 3
    later = {**CONFIG, "train": {"preset": "tiny-cpu", "store_since": timezone.now().isoformat()}}
    empty = start_iteration(None, base_model=base, stages=["sft"], config=later, enqueue=False)
    with pytest.raises(IterationError, match="no SFT store version was made since"):
        training_command(empty, "sft", resume=False)
    from flywheel.demo_report import trained_rows  # the report counts what was trained on, not the whole store

    DatasetVersion.objects.filter(number__in=[1, 2]).update(added_count=40)
    DatasetVersion.objects.filter(number=3).update(added_count=7, row_count=87)
    newest = DatasetVersion.objects.get(number=3)
    assert trained_rows(iteration, newest) == 7 and trained_rows(everything, newest) == 87
    for bad in ("yesterday", "2026-11-23T09:00:00", 5):
        with pytest.raises(ValueError, match="store_since must be a time with its zone"):
            check_train_config({"store_since": bad})


@pytest.mark.parametrize(
    ("stages", "config", "message"),
    [
        (["sft"], {}, "need a base model with a checkpoint"),
        (["validate", "export", "value"], {}, "select PPO too"),
        (["validate", "export", "evaluate"], {}, "select CT, SFT or PPO"),
        (["validate", "export", "sft"], {"promote": "auto"}, "needs the evaluation stage"),
        (["ppo"], {}, "verifiable training tasks"),
        (["sft"], {"promote": "sometimes"}, "config.promote"),
        (["sft"], {"train": {"preset": "huge"}}, "config.train: preset must be one of"),
        (["sft"], {"train": {"sft": {"out": "/tmp/x"}}}, "set by the flywheel"),
        (["sft"], {"train": {"sft": {"warp": 9}}}, "not an option of `python -m training sft`"),
        (["sft"], {"train": {"sft": {"lr": "fast"}}}, "sft.lr must be float"),
        (["sft"], {"train": {"nproc": 0}}, "nproc must be"),
        (["sft"], {"train": {"nproc": 4, "sft": {"batch_episodes": 2}}}, "batch_episodes must be at least nproc"),
        (["sft"], {"evaluate": {"episodes": 0}}, "episodes must be"),
        (["sft"], {"train": "tiny"}, "config.train must be an object"),
    ],
)
def test_starting_refuses_stage_combinations_and_settings_that_cannot_run(stages, config, message, tiny_path):
    base = None if message.startswith("need a base") else tiny_base(tiny_path)
    with pytest.raises(IterationError, match=message):
        start_iteration(None, base_model=base, stages=stages, config=config, enqueue=False)
    assert not Iteration.objects.exists()


def test_sft_needs_data_when_nothing_is_exported(tiny_path):
    with pytest.raises(IterationError, match="needs data"):
        start_iteration(None, base_model=tiny_base(tiny_path), stages=["sft"], enqueue=False)


def test_presets_are_valid_trainer_options():
    from flywheel.training_stages import PRESETS

    assert {"tiny-cpu", "default", "suite-cpu"} <= set(PRESETS)
    for preset in PRESETS:
        checked = check_train_config({"preset": preset, "sft": {"lr": 1e-5}, "ppo": {"lora_r": 4}})
        assert checked["sft"]["lr"] == 1e-5 and checked["ppo"]["lora_r"] == 4
        for stage in ("ct", "sft", "value", "ppo"):
            check_train_config({"preset": preset, stage: dict(checked[stage])})  # every preset key is an option


def test_a_stage_queued_for_a_missing_worker_is_cancelled_at_once_and_its_late_message_does_nothing(tiny_path):
    from annotation_app.celery import app

    base = tiny_base(tiny_path)
    DatasetVersion.objects.create(kind="sft", number=1, manifest={"root": "x", "files": []})
    iteration = start_iteration(None, base_model=base, stages=["sft"], config=CONFIG, enqueue=False)
    try:
        waiting = run_iteration(iteration.pk)  # sends training.flywheel_stage; no train worker here
        assert waiting.status == Iteration.Status.RUNNING and waiting.stages["sft"]["status"] == "queued"
        assert waiting.stages["sft"]["queue"] == "train"
        assert cancel_iteration(waiting).status == Iteration.Status.CANCELLED
        assert run_remote_stage(iteration.pk, "sft") == Iteration.Status.CANCELLED  # the message, delivered late
        assert Iteration.objects.get(pk=iteration.pk).stages["sft"]["status"] == "cancelled"
    finally:
        app.control.purge()


def test_the_stall_check_requeues_only_a_runner_that_is_gone(tiny_path):
    from annotation_app.celery import app

    iteration = start_iteration(None, stages=["validate"], enqueue=False)
    old = (timezone.now() - timedelta(minutes=10)).isoformat()
    Iteration.objects.filter(pk=iteration.pk).update(
        status=Iteration.Status.RUNNING, started_at=timezone.now() - timedelta(minutes=10), current_stage="validate",
        stages={"validate": {"status": "running", "done": 5, "total": 9, "heartbeat": old}},
    )  # fmt: skip
    held, release = threading.Event(), threading.Event()

    def runner() -> None:  # a live runner on another connection holds the iteration's lock
        with advisory_lock(iteration_lock(iteration.pk)):
            held.set()
            release.wait(30)
        connection.close()

    thread = threading.Thread(target=runner)
    thread.start()
    try:
        assert held.wait(30)
        assert requeue_stalled(60) == []
    finally:
        release.set()
        thread.join()
    try:
        assert requeue_stalled(60) == [iteration.pk]
        assert requeue_stalled(60) == []  # its heartbeat restarted the clock: once per stall period
    finally:
        app.control.purge()
