"""The issue's done-when, end to end on the tiny Qwen2.5-VL: trajectories validated and routed → the SFT store
versioned → SFT → a short PPO on two OSWorld-format tasks in the real sandbox service → evaluation of the new model
and its base on held-out tasks → registration (loaded into the embedded policy server) → automatic promotion. One
real Celery worker takes every queue.

The tasks are a terminal task and a copy its setup has already solved (as tests/training/test_sandbox_ppo.py): with
max_new_tokens=8 the tiny model cannot write an action, every episode runs out of steps and is scored on its final
state, so the success counts do not depend on what the random model says."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
import redis
from django.conf import settings

from annotation_app.models import Task
from flywheel.iterations import start_iteration
from flywheel.models import DatasetVersion, Iteration, ModelVersion
from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.leases import LeaseStore

from ..conftest import celery_worker
from ..servers import answers, free_port, running, subprocess_env
from .train_helpers import sft_trajectories, tiny_base, wait_for

pytestmark = [
    pytest.mark.skipif(not (available() and isolation_available()), reason="needs X (Xvfb, openbox) and bubblewrap"),
    pytest.mark.timeout(1800),
]
API_KEY = "e2e-key-" + uuid.uuid4().hex
REDIS_URL = f"{settings.REDIS_URL}/12"
WRITTEN = {"func": "exact_match", "result": {"type": "vm_command_line", "command": "test -s ~/date.txt && echo written",
                                             "shell": True},
           "expected": {"type": "rule", "rules": {"expected": "written"}}}  # fmt: skip
TERMINAL = {"type": "launch", "parameters": {"command": ["xterm", "-maximized"]}}
OPEN = ("Write today's date into a file named date.txt in your home folder.", [TERMINAL])
SOLVED = ("Check that date.txt in your home folder is there.",
          [{"type": "execute", "parameters": {"command": "date > ~/date.txt", "shell": True}}, TERMINAL])  # fmt: skip
CONFIG = {
    "v": {"threshold": 0.5},
    "train": {"preset": "tiny-cpu",
              "ppo": {"env": "sandbox:max_steps=2", "max_new_tokens": 8, "episodes_per_step": 2, "iterations": 1}},
    "evaluate": {"episodes": 2, "max_new_tokens": 8, "env": "sandbox:max_steps=2"},
    "promote": "auto",
}  # fmt: skip


def _tasks() -> None:
    """Two verifiable training tasks and two held-out ones: one open, one solved by its setup, each."""
    for split in ("train", "heldout"):
        for name, (instruction, setup) in (("open", OPEN), ("solved", SOLVED)):
            Task.objects.create(external_id=f"{split}-{name}", instruction=instruction, domain="os",
                                setup_config=setup, evaluator=WRITTEN, metadata={"split": split})  # fmt: skip


def test_validate_export_sft_ppo_evaluate_register_promote(media, transactional_db, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    base = tiny_base(tmp_path / "models" / "tiny")
    sft_trajectories(3)
    _tasks()
    namespace, sandbox_port, policy_port = f"e2e-{uuid.uuid4().hex}", free_port(), free_port()
    sandbox_env = subprocess_env(
        SANDBOX_API_KEY=API_KEY, SANDBOX_REDIS_URL=REDIS_URL, SANDBOX_CAPACITY="2", SANDBOX_WARM="0",
        SANDBOX_ROOT=str(tmp_path / "sessions"), SANDBOX_NAMESPACE=namespace, SANDBOX_ISOLATE="1",
        SANDBOX_PORT=str(sandbox_port),
    )  # fmt: skip
    policy = [sys.executable, "-m", "training.policy.server", "--checkpoint", base.checkpoint_uri, "--name", "tiny"]
    policy += ["--port", str(policy_port), "--threads", "1", "--models-root", str(runs)]
    worker_env = {
        "SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}", "SANDBOX_API_KEY": API_KEY, "FLYWHEEL_RUNS_ROOT": str(runs),
        "POLICY_URL": f"http://127.0.0.1:{policy_port}/v1",
    }  # fmt: skip
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with (
            running([sys.executable, "-m", "sandbox.service"], sandbox_env, tmp_path / "sandbox.log",
                    answers(f"http://127.0.0.1:{sandbox_port}/docs")),
            running(policy, subprocess_env(), tmp_path / "policy.log",
                    answers(f"http://127.0.0.1:{policy_port}/health")),
            celery_worker(tmp_path / "worker.log", **worker_env) as log,
        ):  # fmt: skip
            iteration = start_iteration(
                None, base_model=base, stages=["validate", "export", "sft", "ppo", "evaluate"], config=CONFIG
            )
            done = wait_for(iteration.pk, lambda i: i.finished, timeout=1500, log=log)
            leased = LeaseStore(client, capacity=2, namespace=namespace).live_count()
    finally:
        for key in client.scan_iter(f"{namespace}:*"):
            client.delete(key)
        client.close()
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    assert leased == 0, "every sandbox session was given back"
    assert done.stages["validate"]["output"]["routes"]["sft"] == 3
    assert DatasetVersion.objects.get(iteration=iteration, kind="sft").added_count == 3
    sft, ppo = done.stages["sft"], done.stages["ppo"]
    assert "model_id" not in sft["output"]  # only the chain's last stage is registered
    assert ppo["metrics"] and all("total_steps" in row for row in ppo["metrics"])
    assert ppo["command"][ppo["command"].index("--model") + 1] == sft["output"]["checkpoint"]
    (model,) = ModelVersion.objects.filter(iteration=iteration)
    assert model.stage == "ppo" and model.parent == base and model.checkpoint_uri == ppo["output"]["checkpoint"]
    result = done.stages["evaluate"]["output"]
    assert result["model_id"] == model.pk and result["parent_id"] == base.pk
    # progress counted in episodes over both evaluations (new, then the base), not charted as training metrics
    evaluate = done.stages["evaluate"]
    assert evaluate["done"] == evaluate["total"] == 4 and not evaluate.get("metrics")
    for side in ("new", "parent"):  # an episode whose desktop was lost is in `errors` (and not played, or scored 0)
        played = result[side]
        assert 1 <= played["episodes"] <= 2 and played["episodes"] + len(played.get("errors", [])) >= 2
        assert played["ci_low"] <= played["success_rate"] <= played["ci_high"]
        assert sum(t["episodes"] for t in played["by_task"].values()) == played["episodes"]
    wall = (done.finished_at - done.started_at).total_seconds()
    children = sum(entry.get("child_seconds", 0.0) for entry in done.stages.values())
    stages = {
        name: {"seconds": e.get("seconds"), "child_seconds": e.get("child_seconds")} for name, e in done.stages.items()
    }
    figures = {"wall_s": wall, "trainer_s": children, "overhead_s": wall - children, "stages": stages}
    (tmp_path / "figures.json").write_text(json.dumps(figures))  # the iteration's own overhead: all but the trainer
    model.refresh_from_db()
    assert model.evaluation["new"]["success_rate"] == result["new"]["success_rate"]
    assert result["promoted"] is True and model.is_active and model.endpoint_url  # no model was active before
