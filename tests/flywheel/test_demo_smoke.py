"""The flywheel demonstration's mechanics, end to end on the real stack (issue 16's smoke test): two suite families,
one short iteration after the bootstrap, from an agent pre-trained on one batch of grounding drills. gunicorn +
daphne, a Celery worker on every queue, the sandbox service and the embedded policy server are real processes; the
agent is the tiny model built from a config (or the agent's own builder where it exists). Checked: every stage ran,
trajectories were routed, models were registered, evaluation played held-out instances only (and PPO and RFT training
ones only), the simulated annotators went through the live API, and the report (page data, JSON, PNG) is computed
from the database. It does not check that the agent learns: the demonstration's own run does."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from annotation_app.models import LiveSession, Task, Trajectory
from flywheel.demo import BOOTSTRAP_STAGES, LOOP_STAGES, check_stack, make_plan, run_demo, write_results
from flywheel.demo_report import build_report
from flywheel.models import Iteration, ModelVersion, Validation
from sandbox.desktop import available
from sandbox.isolation import isolation_available
from training.policy.tiny import build_tiny_checkpoint

from ..servers import answers, free_port, running, subprocess_env

pytestmark = [
    pytest.mark.skipif(not (available() and isolation_available()), reason="needs X (Xvfb, openbox) and bubblewrap"),
    pytest.mark.timeout(2700),  # it took over 20 minutes at a load average of 25 on 2 cores
]
API_KEY = "demo-key-" + uuid.uuid4().hex
FAMILIES = ["click-button", "radio"]
SANDBOX_REDIS_DB = int(os.environ.get("TEST_SANDBOX_REDIS_DB", "12"))


START_S = float(os.environ.get("TEST_START_S", "300"))  # start-up of torch-loading servers on a loaded machine


def patient(check: Callable[[], bool], seconds: float = START_S) -> Callable[[], bool]:
    """A readiness check for `running` that itself waits up to `seconds` (its own deadline is a minute)."""

    def ready() -> bool:
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    return ready


@contextmanager
def sandbox_service(tmp_path: Path) -> Iterator[str]:
    """The sandbox service as tests/servers.sandbox_service starts it (isolated sessions, capacity 2, a namespace of
    its own, cleared afterwards), given up to START_S to come up; yields its URL."""
    import redis

    port, namespace, redis_url = free_port(), f"demo-{uuid.uuid4().hex}", f"{settings.REDIS_URL}/{SANDBOX_REDIS_DB}"
    env = subprocess_env(
        SANDBOX_API_KEY=API_KEY, SANDBOX_REDIS_URL=redis_url, SANDBOX_CAPACITY="2", SANDBOX_WARM="0",
        SANDBOX_ROOT=str(tmp_path / "sessions"), SANDBOX_NAMESPACE=namespace, SANDBOX_ISOLATE="1",
        SANDBOX_PORT=str(port),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        with running(
            [sys.executable, "-m", "sandbox.service"], env, tmp_path / "service.log", patient(answers(f"{url}/docs"))
        ):
            yield url
    finally:
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(f"{namespace}:*"):
            client.delete(key)
        client.close()


@contextmanager
def stack(tmp_path: Path, env: dict[str, str]) -> Iterator[str]:
    """gunicorn (as tests/servers.web_stack starts it) and a Celery worker on every queue (as conftest.celery_worker),
    each given up to START_S to come up; yields the web app's URL."""
    from annotation_app.celery import app

    port, bin_dir = free_port(), Path(sys.executable).parent
    base = f"http://127.0.0.1:{port}"
    gunicorn = [str(bin_dir / "gunicorn"), "annotation_app.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    gunicorn += ["--worker-class", "gthread", "--workers", "2", "--threads", "2"]
    worker = [sys.executable, "-m", "celery", "-A", "annotation_app", "worker", "--pool", "solo", "--loglevel", "INFO"]
    worker += [
        "-Q",
        ",".join(settings.CELERY_QUEUES),
        "--without-gossip",
        "--without-mingle",
        "-n",
        f"demo-{os.getpid()}@%h",
    ]
    app.control.purge()
    with (
        running(gunicorn, subprocess_env(**env), tmp_path / "gunicorn.log", patient(answers(f"{base}/healthz"))),
        running(worker, subprocess_env(**env), tmp_path / "worker.log", patient(lambda: bool(app.control.ping()))),
    ):  # fmt: skip
        yield base


def test_demo_runs_every_stage_through_the_platform(media, transactional_db, tmp_path, settings):
    runs = tmp_path / "runs"
    runs.mkdir()
    policy_port = free_port()
    reported: list[tuple] = []  # the progress display's calls: (stage, iteration, done, total)
    # What an earlier run left: a submitted trajectory in a suite domain. A demonstration neither validates nor
    # trains on it (it validates what was submitted since it began and has tasks of its own).
    earlier_task = Task.objects.create(instruction="left over", domain=f"suite-{FAMILIES[0]}", evaluator={"func": "x"})
    leftover = Trajectory.objects.create(task=earlier_task, mode=Trajectory.Mode.ROLLOUT,
                                         status=Trajectory.Status.SUBMITTED, submitted_at=timezone.now())  # fmt: skip
    # The mechanics only: the shortest training runs, whatever the agent's own preset.
    plan = make_plan(
        quick=True, seed=3, families=FAMILIES, iterations=1, train_per_family=1, heldout_per_family=1,
        annotate_per_iteration=1, annotators=1, rft_tasks_per_iteration=1, rft_attempts=1, max_steps=3,
        preset="tiny-cpu", train={"ppo": {"env": "sandbox:max_steps=2", "iterations": 1, "max_new_tokens": 24}},
        evaluate={"max_new_tokens": 24}, rft={"max_tokens": 24}, drills=32,
    )  # fmt: skip
    policy = [sys.executable, "-m", "training.policy.server", "--name", "tiny-uitars", "--port", str(policy_port)]
    policy += ["--threads", "1", "--models-root", str(runs), "--checkpoint", str(build_tiny_checkpoint(runs / "tiny"))]
    with sandbox_service(tmp_path) as sandbox_url:
        env = {
            "SANDBOX_URL": sandbox_url, "SANDBOX_API_KEY": API_KEY, "FLYWHEEL_RUNS_ROOT": str(runs),
            "POLICY_URL": f"http://127.0.0.1:{policy_port}/v1", "LIVE_CANDIDATES": "2", "LIVE_MAX_TOKENS": "48",
        }  # fmt: skip
        settings.SANDBOX_URL, settings.SANDBOX_API_KEY = sandbox_url, API_KEY
        settings.EMBEDDED_POLICY_URL, settings.FLYWHEEL_RUNS_ROOT = env["POLICY_URL"], runs
        log = tmp_path / "worker.log"
        with (
            running(policy, subprocess_env(), tmp_path / "policy.log",
                    patient(answers(f"http://127.0.0.1:{policy_port}/health"))),
            stack(tmp_path, env) as base_url,
        ):  # fmt: skip
            assert check_stack(base_url) == []
            try:
                root = run_demo(plan, base_url, lambda *args: reported.append(args))
            except Exception:
                print(log.read_text()[-6000:])
                raise
            report_json, report_png = write_results(root, tmp_path / "report")

    train = set(
        Task.objects.filter(project="demo-suite", metadata__split="train").values_list("external_id", flat=True)
    )
    heldout = set(
        Task.objects.filter(project="demo-suite", metadata__split="heldout").values_list("external_id", flat=True)
    )
    assert len(train) == len(heldout) == len(FAMILIES) and not train & heldout
    assert all(external_id.endswith(f"@{root.name}") for external_id in train | heldout)  # this run's own tasks

    # The untrained agent was pre-trained on one batch of grounding drills first, and that is the root served.
    drilling = list(itertools.takewhile(lambda call: call[0] == "drills", reported))
    assert drilling[0] == ("drills", 0, 0, 32) and drilling[-1] == ("drills", 0, 32, 32)
    assert reported[len(drilling)][0] == "bootstrap"
    assert Path(root.checkpoint_uri) == runs / "demo" / f"{root.name}-drills" / "final"
    drilled, built = Path(root.checkpoint_uri) / "model.safetensors", runs / "demo" / root.name / "model.safetensors"
    assert drilled.read_bytes() != built.read_bytes() and "32 grounding drills" in root.notes
    assert root.metrics["drills"]["count"] == 32 and root.metrics["drills"]["seconds"] > 0  # the report's first stage

    bootstrap, loop = Iteration.objects.filter(base_model__isnull=False).order_by("created_at")
    assert bootstrap.base_model == root and bootstrap.domains == plan.domains
    assert not Validation.objects.filter(trajectory=leftover).exists()
    assert {it.config["train"]["store_since"] for it in (bootstrap, loop)} == {root.created_at.isoformat()}
    for iteration, stages in ((bootstrap, BOOTSTRAP_STAGES), (loop, LOOP_STAGES)):
        assert iteration.status == Iteration.Status.SUCCEEDED, iteration.error
        assert iteration.selected_stages == list(stages)
        assert all(iteration.stages[s]["status"] == "done" for s in stages), iteration.stages
        # Evaluation played the held-out instances only; PPO the training ones only.
        evaluated = [
            json.loads(line)["id"] for line in open(Path(iteration.stages["evaluate"]["run_dir"]) / "heldout.jsonl")
        ]
        assert set(evaluated) == heldout
        for side in ("new", "parent"):
            assert set(iteration.stages["evaluate"]["output"][side]["by_task"]) <= heldout

    ppo_tasks = [json.loads(line)["id"] for line in open(Path(loop.stages["ppo"]["run_dir"]) / "tasks.jsonl")]
    assert set(ppo_tasks) <= train

    # Bootstrap: the oracle's demonstrations, recorded through the sandbox, were routed; the verified ones to SFT.
    demos = Validation.objects.filter(iteration=bootstrap, trajectory__metadata__origin="demo")
    assert demos.count() == len(train) and demos.filter(route="sft").exists()
    assert all(v.trajectory.simulated and v.trajectory.steps.exists() for v in demos)
    # Browser tasks: every step kept the page outline the agent reads, so the SFT store shows it too.
    assert all(step.outline for v in demos for step in v.trajectory.steps.all())

    # The iteration: simulated annotators through the live API, RFT rollouts on training tasks, all routed.
    annotated = Trajectory.objects.filter(mode=Trajectory.Mode.INTERACTIVE, validations__iteration=loop)
    assert annotated.exists()
    assert all(t.simulated and t.annotator.is_simulated for t in annotated)
    assert LiveSession.objects.filter(trajectory__in=annotated).count() == annotated.count()
    assert all(t.steps.exclude(candidates=[]).exists() for t in annotated), "the model proposed at every session"
    rollouts = Trajectory.objects.filter(metadata__origin="rft", metadata__rft__iteration=loop.pk)
    assert rollouts.exists() and {t.task.external_id for t in rollouts} <= train
    routed = Validation.objects.filter(iteration=loop)
    assert set(routed.values_list("trajectory_id", flat=True)) >= set(annotated.values_list("id", flat=True))

    # Models registered with lineage; the report is computed from the database.
    assert ModelVersion.objects.filter(iteration=bootstrap, stage="sft", parent=root).exists()
    assert ModelVersion.objects.filter(iteration=loop, stage="ppo").exists()
    report = build_report(root)
    assert [r["iteration"] for r in report["iterations"]] == [bootstrap.pk, loop.pk]
    for row in report["iterations"]:
        assert set(row["heldout"]["by_family"]) == set(FAMILIES)
        overall = row["heldout"]["overall"]
        assert overall["n"] == len(heldout) and overall["ci_low"] <= overall["ci_high"]
        assert row["sft_share"]["n"] == row["new_trajectories"] > 0
    assert report["iterations"][1]["acceptance"]["n"] > 0
    assert set(report["iterations"][1]["stages"]) >= {"annotation", *LOOP_STAGES}
    assert json.loads(report_json.read_text())["root"] == root.name
    assert report_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
