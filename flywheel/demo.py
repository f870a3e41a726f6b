"""The flywheel demonstration (issue 16): the bundled task suite in the task pool, a bootstrap of oracle
demonstrations recorded through the sandbox, iteration 0 = SFT of the untrained agent on them, then iterations of
simulated annotation (the live API, the promoted model proposing) → RFT → validation/routing → SFT + a short PPO →
held-out evaluation → automatic promotion. Every stage runs on the platform itself (PostgreSQL, the Celery workers,
the sandbox service, the embedded policy server, `flywheel.iterations`); nothing here scores or trains on the side.
The report is computed afterwards from the database (`flywheel/demo_report.py`)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from annotation_app.evaluation import evaluate_trajectory
from annotation_app.live.sessions import sandbox_as
from annotation_app.models import Step, Task, Trajectory
from annotation_app.task_import import import_tasks
from sandbox.suite import families as suite_families
from sandbox.suite import family, suite_tasks
from sandbox.suite.run import read_state
from training.rollout import Reply, run_episode

from . import registry
from .demo_families import DEFAULT_AGENT_FAMILIES, FULL_FAMILIES, QUICK_FAMILIES
from .demo_progress import TerminalProgress
from .iterations import cancel_iteration, start_iteration
from .models import Iteration, ModelVersion, Stage
from .progress import IterationError
from .rft import check_rft_config
from .rft_attempt import CapacityGate, RecordingClient, RolloutEnv, StepRecorder, task_spec
from .training_stages import PRESETS, runs_root

log = logging.getLogger(__name__)

PROJECT = "demo-suite"  # Task.project of the demonstration's tasks
ROOT_PREFIX = "demo-agent"  # registry name of the untrained agent; every model of a demonstration descends from it
DEMO_ORIGIN = "demo"  # Trajectory.metadata["origin"] of a bootstrap demonstration (the oracle's, via the sandbox)
ITERATION_TIMEOUT_S = 3600.0
CANCEL_WAIT_S = 30.0  # for the worker to stop a cancelled stage (its trainer gets 10 s of grace after SIGTERM)

Progress = Callable[[str, int, int | None, int | None], None]  # (stage, iteration, done, total)


class DemoError(Exception):
    """The demonstration cannot start or a stage failed; the message says what to do."""


@dataclass(frozen=True)
class DemoPlan:
    """Sizes and settings of one demonstration (from `make_plan`; written on the untrained model's notes)."""

    seed: int
    families: tuple[str, ...]
    iterations: int
    quick: bool
    levels: tuple[int, ...] = (1,)
    train_per_family: int = 6
    heldout_per_family: int = 4
    bootstrap_per_family: int | None = None  # training instances with an oracle demonstration (None: all of them)
    retrain: bool = True  # each iteration trains the untrained agent on the whole store (else the promoted model)
    demos_per_task: int = 1
    annotate_per_iteration: int = 6  # training tasks the simulated annotators do live per iteration
    annotators: int = 2
    mistake_rate: float = 0.0
    rft_attempts: int = 2
    rft_tasks_per_iteration: int = 6
    max_steps: int = 8
    preset: str = "tiny-cpu"
    train: dict[str, Any] = field(default_factory=dict)
    evaluate: dict[str, Any] = field(default_factory=dict)
    rft: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 2
    drills: int = 0  # grounding drills the untrained agent is pre-trained on before the bootstrap (training/drills.py)

    @property
    def domains(self) -> list[str]:
        return [f"suite-{name}" for name in self.families]


MAX_PER_FAMILY = 20  # instances of a family annotated (or sampled by RFT) in one iteration, at most
MIN_DRILLS, MAX_DRILLS = 32, 200_000  # one batch of drills; about 40 minutes of them on 2 cores
# The full plan's agent is pre-trained on grounding drills (about 7 minutes): without them it picks among a page's
# elements at chance whatever the flywheel brings (docs/agent.md, "Does it ground?"); `--quick` stays without.
FULL_DRILLS = 32_000
FULL_RFT_TEMPERATURE = 0.5
FULL_ITERATION_SIZES = (8, 5)  # instances of each family annotated live, and sampled by RFT, every iteration


def agent_preset() -> str:
    """The trainer preset for the suite's agent ("suite-cpu" once the agent's recipe provides it), else "tiny-cpu"."""
    return "suite-cpu" if "suite-cpu" in PRESETS else "tiny-cpu"


def make_plan(*, quick: bool = False, seed: int = 0, families: list[str] | None = None, iterations: int | None = None,
              **overrides: Any) -> DemoPlan:  # fmt: skip
    """The demonstration's plan: `--quick` is two families, fewer instances and two iterations (≤ 10 min), else six
    families and three iterations (≤ 60 min)."""
    if iterations is None:
        iterations = 2 if quick else 3
    known = suite_families()
    chosen = tuple(families or (QUICK_FAMILIES if quick else FULL_FAMILIES))
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise DemoError(f"unknown famil{'ies' if len(unknown) > 1 else 'y'}: {', '.join(unknown)} "
                        f"(known: {', '.join(known)})")  # fmt: skip
    if not 0 <= iterations <= 10:
        raise DemoError("iterations must be from 0 to 10")
    preset = agent_preset()
    small = preset == "tiny-cpu"  # the random tiny model: only the mechanics, so keep its runs short

    def per_family(count: int) -> int:
        # Annotation and RFT take a whole number of instances of every family, so each iteration's mix is the same:
        # 16 RFT tasks over six families gave two families three and the others two, in an order that rotated, and
        # the SFT share followed which families RFT drew more than how good the model was. `--quick` keeps 4 and 4
        # (2 of each of its two families; scripts/run's default agent, one iteration over six, stays as fast).
        return count * len(chosen)

    # Level-1 instances take the oracle 2-4 steps, so episodes stop at 4 or 6. The bootstrap is a few demonstrations
    # per family; each iteration's annotation and RFT then bring tasks the model has not seen. Every iteration
    # retrains the untrained agent with the same number of SFT steps on the whole store (then a short PPO), so what a
    # model gains over the one before comes from the flywheel's new data.
    # PPO plays one episode at a time: its local policy batches whatever episodes ask at the same moment and samples
    # from one random stream, so two at once made a run's rollouts depend on timing.
    ppo = {"iterations": 1, "concurrency": 1} | ({"episodes_per_step": 4} if quick else {})
    # `max_steps` sets the SFT's length (the trainer stops at the smaller of it and epochs × store).
    agent_train = {"sft": {"epochs": 1000, "max_steps": 120 if quick else 200}, "ppo": ppo}
    plan = DemoPlan(
        seed=seed, families=chosen, iterations=iterations, quick=quick, preset=preset,
        train_per_family=20 if quick else 24, heldout_per_family=4 if quick else 16,
        bootstrap_per_family=4 if quick else 2,
        annotate_per_iteration=4 if quick else per_family(4), rft_tasks_per_iteration=4 if quick else per_family(3),
        rft_attempts=1 if quick else 2, max_steps=4 if quick else 6,
        train={"ppo": {"env": "sandbox:max_steps=4", "iterations": 1}} if small else agent_train,
        evaluate={"max_new_tokens": 64} if small else {},
        rft={"max_tokens": 64} if small else {},
        drills=0 if quick or small else FULL_DRILLS,
    )  # fmt: skip
    if not (quick or small):
        plan = full_plan_settings(plan)
    plan = replace(plan, **overrides)
    if plan.drills and not MIN_DRILLS <= plan.drills <= MAX_DRILLS:
        raise DemoError(f"drills must be 0 (none) or from {MIN_DRILLS} to {MAX_DRILLS}")
    if plan.bootstrap_per_family is not None and plan.bootstrap_per_family < 1:
        raise DemoError("the bootstrap must be at least 1 demonstration per family")
    return plan


def full_plan_settings(plan: DemoPlan) -> DemoPlan:
    """The full plan's defaults, each learnt from a run (docs/flywheel.md, "The demonstration"): every instance at
    difficulty level 2 where each family has it (at level 1 the drilled base starts at half the held-out instances,
    so no run could double it), RFT sampled at temperature 0.5 (the byte-level agent writes clean text only near its
    greedy answer) and 8 instances of each family annotated and 5 sampled by RFT every iteration (evaluation keeping
    its sessions saved the time), so the SFT share and the acceptance are measured on enough trajectories to rise."""
    if all(2 in family(name).levels for name in plan.families):
        plan = with_levels(plan, (2,))
    plan = replace(plan, rft={**plan.rft, "temperature": FULL_RFT_TEMPERATURE})
    return with_iteration_sizes(plan, *FULL_ITERATION_SIZES)


# --- the stack -------------------------------------------------------------------------------------------------------


def policy_check() -> tuple[str, str]:
    """The embedded policy server's health check, as (what, url)."""
    return "the policy server", settings.EMBEDDED_POLICY_URL.rstrip("/").removesuffix("/v1") + "/health"


def unanswered(checks: list[tuple[str, str]]) -> list[str]:
    """For each (what, url) that does not answer 200, a line saying so."""
    problems = []
    for what, url in checks:
        try:
            if httpx.get(url, timeout=5).status_code != 200:
                problems.append(f"{what} at {url} does not answer 200")
        except httpx.HTTPError as exc:
            problems.append(f"{what} at {url} does not answer ({type(exc).__name__})")
    return problems


def waited(check: Callable[[], list[str]], wait_s: float, every_s: float = 2.0) -> list[str]:
    """`check()`'s problems, asked again every `every_s` for up to `wait_s` while there are any: a stack just started
    brings its processes up one by one (the policy server loads its model, the workers come up last)."""
    problems, deadline = check(), time.monotonic() + wait_s
    while problems and time.monotonic() < deadline:
        time.sleep(every_s)
        problems = check()
    return problems


def check_stack(base_url: str) -> list[str]:
    """What the demonstration needs and does not find running: the web app (for the simulated annotators), the
    sandbox service, the embedded policy server and a Celery worker on each queue it uses."""
    problems = unanswered([("the web app", f"{base_url.rstrip('/')}/healthz"),
                           ("the sandbox service", f"{settings.SANDBOX_URL}/docs"), policy_check()])  # fmt: skip
    from annotation_app.celery import app

    try:
        active = app.control.inspect(timeout=2).active_queues() or {}
    except Exception as exc:  # the broker is down
        return [*problems, f"no Celery worker answers ({type(exc).__name__}: {exc})"]
    served = {queue["name"] for queues in active.values() for queue in queues}
    missing = [q for q in ("flywheel", "train", "sandbox", "live") if q not in served]
    if missing:
        problems.append(f"no Celery worker consumes the queue(s) {', '.join(missing)}")
    return problems


# --- 1. the task pool ----------------------------------------------------------------------------------------------


def import_suite(plan: DemoPlan, run: str) -> tuple[list[Task], list[Task]]:
    """Import the plan's suite instances (training and held-out) into the task pool as this run's own tasks (external
    id `<instance>@<run>`, project "demo-suite"); the training and the held-out Task rows. Each run has its own rows,
    so an earlier run's trajectories on the same instances are neither its near duplicates nor its data."""
    import json

    rows = suite_tasks(list(plan.families), plan.train_per_family, plan.heldout_per_family, list(plan.levels))
    rows = [{**row, "id": f"{row['id']}@{run}", "metadata": {**row["metadata"], "demonstration": run}} for row in rows]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    import_tasks(data, "demo-suite.jsonl", on_conflict="skip")
    ids = [row["id"] for row in rows]
    Task.objects.filter(external_id__in=ids).update(project=PROJECT)
    tasks = list(Task.objects.filter(external_id__in=ids).order_by("id"))
    train = [t for t in tasks if (t.metadata or {}).get("split") != "heldout"]
    heldout = [t for t in tasks if (t.metadata or {}).get("split") == "heldout"]
    return train, heldout


# --- 2. the untrained agent ------------------------------------------------------------------------------------------


def build_untrained(path: Path, seed: int) -> Path:
    """The untrained agent's checkpoint: the agent builder where the agent's recipe provides one
    (training.agent.build_agent), else the tiny Qwen2.5-VL built from a config. No download either way."""
    try:
        agent = importlib.import_module("training.agent")
    except ModuleNotFoundError as exc:
        if exc.name != "training.agent":
            raise
        agent = None
    builder, config = getattr(agent, "build_agent", None), getattr(agent, "AgentConfig", None)
    if builder is not None:
        return Path(builder(path, config(seed=seed)) if config is not None else builder(path))
    from training.policy.tiny import build_tiny_checkpoint

    return Path(build_tiny_checkpoint(path, seed=seed))


def run_name(plan: DemoPlan) -> str:
    """A new name per demonstration: its untrained agent's (the report finds a demonstration by it) and its tasks'."""
    return f"{ROOT_PREFIX}-s{plan.seed}-{timezone.now().strftime('%Y%m%d-%H%M%S')}"


def untrained_agent(plan: DemoPlan, name: str, progress: Progress) -> ModelVersion:
    """Register the untrained agent as `name` (pre-trained on the plan's grounding drills, if any), serve it from the
    embedded policy server and make it the annotation model, so iteration 0 is compared with it."""
    drilled = f" (pre-trained on {plan.drills} grounding drills)" if plan.drills else ""
    checkpoint = build_untrained(runs_root() / "demo" / name, plan.seed)
    metrics: dict[str, Any] = {}
    if plan.drills:
        from training.drills import drill_agent

        progress("drills", 0, 0, plan.drills)
        started = time.monotonic()
        checkpoint = drill_agent(checkpoint, runs_root() / "demo" / f"{name}-drills", count=plan.drills,
                                 seed=plan.seed, progress=False,
                                 on_progress=lambda done: progress("drills", 0, done, plan.drills))  # fmt: skip
        # the report shows them as iteration 0's first stage: they run before any iteration exists
        metrics["drills"] = {"count": plan.drills, "seconds": round(time.monotonic() - started, 1)}
    release_earlier_demonstrations()
    problem = registry.load_into_embedded_server(name, str(checkpoint))
    if problem:
        raise DemoError(f"the policy server cannot serve the untrained agent: {problem} (start it with "
                        f"--models-root {runs_root()})")  # fmt: skip
    model = registry.register_by_hand(
        None, name=name, checkpoint_uri=str(checkpoint), endpoint_url=settings.EMBEDDED_POLICY_URL, served_name=name,
        notes=f"flywheel demonstration: untrained agent{drilled}; plan {json_plan(plan)}",
    )  # fmt: skip
    if metrics:
        model.metrics = {**(model.metrics or {}), **metrics}
        model.save(update_fields=["metrics"])
    registry.promote(model, by=None, reason="flywheel demonstration: the untrained agent starts")
    return model


def release_earlier_demonstrations() -> None:
    """Unload earlier demonstrations' models from the embedded policy server, all but the active one: the server
    holds a few models at once (--max-models) and keeps them across restarts, so a second run found it full."""
    from .demo_report import lineage, roots

    for root in roots():
        for model in lineage(root):
            if not model.is_active and model.served_name and model.endpoint_url == settings.EMBEDDED_POLICY_URL:
                registry.unload_from_embedded_server(model.served_name)


def json_plan(plan: DemoPlan) -> str:
    import json

    return json.dumps(asdict(plan), sort_keys=True)


# --- 3. bootstrap demonstrations -------------------------------------------------------------------------------------


def oracle_reply(client: RecordingClient, session: str, task: Task) -> Reply:
    """The oracle's next action for the session's state as a model turn, in the model's frame and with the thought
    the agent's own demonstrations use (sandbox/suite/demos.py: clicks at the centre the page's outline shows)."""
    from sandbox.suite import oracle_action
    from sandbox.suite.demos import demonstration_turn

    action = oracle_action((task.metadata or {}).get("suite"), task, read_state(client.client, session, task))
    outlined = client.kind == "browser" and hasattr(client.client, "outline")
    elements = client.client.outline(session) if outlined else []
    thought, action_text = demonstration_turn(action, client.mapping, elements)
    return Reply(f"Thought: {thought}\nAction: {action_text}")


def record_demonstration(task_id: int, attempt: int, root_id: int, max_steps: int, gate: CapacityGate) -> int | None:
    """Play the oracle on one training task in a leased sandbox session and store it as it happens (the RFT recorder:
    screenshot and action per step, in screen pixels), scored by the task's evaluator and submitted; its id."""
    task = Task.objects.get(pk=task_id)
    trajectory = Trajectory.objects.create(
        task=task, mode=Trajectory.Mode.ROLLOUT, status=Trajectory.Status.IN_PROGRESS, simulated=True,
        metadata={"origin": DEMO_ORIGIN, "rft": {"attempt": attempt, "demo_root": root_id}},
    )  # fmt: skip
    kind = "browser" if task.platform == Task.Platform.BROWSER else "desktop"
    client = RecordingClient(sandbox_as(f"trajectory:{trajectory.pk}"), trajectory, kind, gate, threading.Event())
    recorder = StepRecorder(trajectory, client, root_id)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="demo-") as tmp:
            env = RolloutEnv(client, task_spec(task), Path(tmp) / "images", recorder=recorder, max_steps=max_steps)

            def ask(messages: list[dict[str, Any]]) -> tuple[Reply, int]:
                recorder.turn_started = timezone.now()
                return oracle_reply(client, env.session, task), 0

            try:
                run_episode(env, ask, seed=attempt, max_turns=max_steps)
                if not client.evaluated and env.session is not None:
                    evaluate_trajectory(client.client, env.session, trajectory, None)
            finally:
                env.close()
    except Exception:
        Trajectory.objects.filter(pk=trajectory.pk).update(status=Trajectory.Status.ABANDONED)
        log.warning("demonstration of task %s failed", task_id, exc_info=True)
        return None
    finally:
        connection.close()
    Step.objects.filter(trajectory=trajectory).update(source=Step.Source.HUMAN, model_version=None)
    trajectory.refresh_from_db()
    meta = dict(trajectory.metadata)
    demo = {**meta.pop("rft", {}), "steps": recorder.index, "seconds": round(time.monotonic() - started, 3)}
    demo.pop("session", None)
    trajectory.metadata = {**meta, "demo": demo}
    trajectory.status, trajectory.submitted_at = Trajectory.Status.SUBMITTED, timezone.now()
    trajectory.save(update_fields=["metadata", "status", "submitted_at", "updated_at"])
    return trajectory.pk


def record_demonstrations(plan: DemoPlan, tasks: list[Task], root: ModelVersion, progress: Progress) -> list[int]:
    """The bootstrap SFT data: the oracle on every training task (`demos_per_task` times), `concurrency` at once."""
    jobs = [(t.pk, n) for t in tasks for n in range(plan.demos_per_task)]
    gate = CapacityGate(600.0)
    done: list[int] = []
    progress("demonstrations", 0, 0, len(jobs))
    with ThreadPoolExecutor(max_workers=plan.concurrency, thread_name_prefix="demo") as pool:
        futures = [pool.submit(record_demonstration, pk, n, root.pk, plan.max_steps * 2, gate) for pk, n in jobs]
        for n, future in enumerate(futures, 1):
            pk = future.result()
            if pk is not None:
                done.append(pk)
            progress("demonstrations", 0, n, len(jobs))
    if not done:
        raise DemoError("no demonstration could be recorded (see the log: is the sandbox service up?)")
    return done


# --- 4. simulated annotation -----------------------------------------------------------------------------------------


def annotate(plan: DemoPlan, base_url: str, tasks: list[Task], iteration: int, progress: Progress) -> list[dict]:
    """Simulated annotators do `tasks` live through the web app's API (annotation_app.simulated): the promoted model
    proposes, they accept a correct proposal or override it with the oracle's action."""
    try:
        simulated = importlib.import_module("annotation_app.simulated")
    except ModuleNotFoundError as exc:
        if exc.name != "annotation_app.simulated":
            raise
        raise DemoError("simulated annotators are not installed (annotation_app.simulated)") from None
    annotators = simulated.simulated_annotators(plan.annotators)
    progress("annotation", iteration, 0, len(tasks))

    finished: list[dict[str, Any]] = []

    def report(result: dict[str, Any]) -> None:
        finished.append(result)
        progress("annotation", iteration, len(finished), len(tasks))

    return simulated.annotate_tasks(
        base_url, tasks, annotators, seed=plan.seed * 1000 + iteration, mistake_rate=plan.mistake_rate,
        max_steps=plan.max_steps * 2, progress=report,
    )  # fmt: skip


# --- 5. the flywheel's iterations ------------------------------------------------------------------------------------


def iteration_config(plan: DemoPlan, train: list[Task], heldout: list[Task], rft_tasks: list[Task],
                     since: datetime, start_from: ModelVersion | None = None) -> dict[str, Any]:  # fmt: skip
    """The iteration's config: the agent's preset, training from `start_from` (else the base model) on the store
    versions made `since` the demonstration began (its root's creation), PPO on the demonstration's training tasks,
    evaluation on its held-out tasks only (each once, greedy), RFT on this iteration's share of training tasks,
    automatic promotion."""
    start = {"start_from": start_from.pk} if start_from is not None and plan.retrain else {}
    start["store_since"] = since.isoformat()
    config: dict[str, Any] = {
        "v": {"threshold": 0.5},
        "train": {"preset": plan.preset, "tasks": {"ids": [t.pk for t in train]}, **start, **plan.train},
        "evaluate": {"episodes": len(heldout), "task_ids": [t.pk for t in heldout], "temperature": 0.0,
                     "seed": 0, "env": f"sandbox:max_steps={plan.max_steps}", **plan.evaluate},
        "promote": "auto",
    }  # fmt: skip
    if rft_tasks:
        config["rft"] = {"tasks": [t.pk for t in rft_tasks], "attempts": plan.rft_attempts,
                         "max_steps": plan.max_steps, "concurrency": plan.concurrency, "seed": plan.seed,
                         **plan.rft}  # fmt: skip
    return config


def run_flywheel(plan: DemoPlan, base: ModelVersion, stages: list[str], config: dict[str, Any], number: int,
                 progress: Progress, since: datetime, timeout_s: float = ITERATION_TIMEOUT_S) -> Iteration:  # fmt: skip
    """Start an iteration on the workers (the `flywheel` queue) that validates the trajectories of the plan's
    domains submitted `since` (the demonstration's start), and follow it to its end."""
    try:
        iteration = start_iteration(None, base_model=base, domains=plan.domains, date_from=since, stages=stages,
                                    config=config)  # fmt: skip
    except IterationError as exc:
        raise DemoError(f"iteration {number} cannot start: {exc}") from None
    return follow(iteration, stages, number, progress, timeout_s)


def follow(iteration: Iteration, stages: list[str], number: int, progress: Progress,
           timeout_s: float = ITERATION_TIMEOUT_S) -> Iteration:  # fmt: skip
    """Show an iteration's progress until it ends; one the demonstration stops following (Ctrl-C, its timeout) is
    cancelled, so its worker stops the stage's trainer rather than leaving it to outlive the run's stack."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            iteration.refresh_from_db()
            stage = iteration.current_stage or stages[0]
            entry = iteration.stages.get(stage, {})
            progress(stage, number, entry.get("done"), entry.get("total"))
            if iteration.finished:
                break
            if time.monotonic() > deadline:
                raise DemoError(f"iteration {iteration.pk} did not finish within {timeout_s:.0f} s (stage {stage})")
            time.sleep(1.0)
    except BaseException:
        abandon(iteration)
        raise
    if iteration.status != Iteration.Status.SUCCEEDED:
        raise DemoError(f"iteration {iteration.pk} {iteration.status}: {iteration.error}")
    return iteration


def abandon(iteration: Iteration, wait_s: float = CANCEL_WAIT_S) -> None:
    """Cancel an unfinished iteration and wait up to `wait_s` for its worker to stop it (a trainer child gets
    SIGTERM, then SIGKILL after the stage's grace period)."""
    try:
        iteration = cancel_iteration(iteration)
    except IterationError:  # it has just ended
        return
    deadline = time.monotonic() + wait_s
    try:
        while not iteration.finished and time.monotonic() < deadline:
            time.sleep(0.5)
            iteration.refresh_from_db()
    except DatabaseError:  # the stack is going down (scripts/run's exit): the cancel request is stored already
        log.warning("iteration %s: database gone while waiting for its worker to stop", iteration.pk)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (scripts/run's exit, `kill`, a supervisor) stops the command as Ctrl-C does: KeyboardInterrupt reaches
    `follow`, which cancels the running iteration instead of leaving it to run on (or be requeued) without anyone
    following it. Only the main thread can take signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def active_model(fallback: ModelVersion) -> ModelVersion:
    return ModelVersion.objects.filter(is_active=True).first() or fallback


BOOTSTRAP_STAGES = [Stage.VALIDATE, Stage.EXPORT, Stage.SFT, Stage.EVALUATE]
LOOP_STAGES = [Stage.RFT, Stage.VALIDATE, Stage.EXPORT, Stage.SFT, Stage.PPO, Stage.EVALUATE]


def grouped(tasks: list[Task], key: str) -> list[list[Task]]:
    """The tasks grouped by `metadata[key]`, groups in order of first appearance, each group's in their order."""
    groups: dict[str, list[Task]] = {}
    for task in tasks:
        groups.setdefault(str((task.metadata or {}).get(key)), []).append(task)
    return list(groups.values())


def round_robin(tasks: list[Task], key: str) -> list[Task]:
    """The tasks round-robin by `metadata[key]`, each group's in their order."""
    columns = grouped(tasks, key)
    return [column[n] for n in range(max(map(len, columns), default=0)) for column in columns if n < len(column)]


def interleave(tasks: list[Task]) -> list[Task]:
    """The tasks round-robin by family (metadata.suite), each family's round-robin by difficulty level: any prefix
    is balanced by family, and by level within a family."""
    by_level = [t for family in grouped(tasks, "suite") for t in round_robin(family, "difficulty")]
    return round_robin(by_level, "suite")


def split_training(plan: DemoPlan, train: list[Task]) -> tuple[list[Task], list[Task]]:
    """The bootstrap's tasks (`bootstrap_per_family` of each family) and the rest, which the iterations' annotation
    and RFT go through first (both interleaved by family)."""
    mixed = interleave(train)
    families = len({(t.metadata or {}).get("suite") for t in train})
    cut = len(mixed) if plan.bootstrap_per_family is None else plan.bootstrap_per_family * families
    return mixed[:cut], mixed[cut:] or mixed


def rotate(tasks: list[Task], count: int, offset: int) -> list[Task]:
    """`count` tasks from `tasks`, starting at `offset` and wrapping: each iteration takes the next ones."""
    if not tasks or count <= 0:
        return []
    return [tasks[(offset + n) % len(tasks)] for n in range(min(count, len(tasks)))]


def iteration_tasks(plan: DemoPlan, fresh: list[Task], number: int) -> tuple[list[Task], list[Task]]:
    """Iteration `number`'s (from 1) tasks for the simulated annotators and for RFT: the next ones of `fresh`."""
    offset = (number - 1) * (plan.annotate_per_iteration + plan.rft_tasks_per_iteration)
    annotated = rotate(fresh, plan.annotate_per_iteration, offset)
    return annotated, rotate(fresh, plan.rft_tasks_per_iteration, offset + plan.annotate_per_iteration)


def run_demo(plan: DemoPlan, base_url: str, progress: Progress) -> ModelVersion:
    """The whole demonstration; returns the untrained agent, the root the report finds the demonstration by."""
    name = run_name(plan)
    train, heldout = import_suite(plan, name)
    if not heldout or not train:
        raise DemoError("the plan has no training or no held-out tasks")
    root = untrained_agent(plan, name, progress)
    progress("bootstrap", 0, 0, None)
    bootstrap, fresh = split_training(plan, train)
    record_demonstrations(plan, bootstrap, root, progress)
    since = root.created_at
    config = iteration_config(plan, train, heldout, [], since)
    run_flywheel(plan, root, BOOTSTRAP_STAGES, config, 0, progress, since)
    for number in range(1, plan.iterations + 1):
        annotated, sampled = iteration_tasks(plan, fresh, number)
        annotate(plan, base_url, annotated, number, progress)
        config = iteration_config(plan, train, heldout, sampled, since, start_from=root)
        run_flywheel(plan, active_model(root), LOOP_STAGES, config, number, progress, since)
    progress("report", plan.iterations, 1, 1)
    return root


# --- the command ---------------------------------------------------------------------------------------------------


def write_results(root: ModelVersion, out: Path) -> tuple[Path, Path]:
    """report.json and report.png of the demonstration, computed from the database (flywheel.demo_report)."""
    import json

    from .demo_report import build_report, plot_png

    report = build_report(root)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.png").write_bytes(plot_png(report))
    return out / "report.json", out / "report.png"


def summary_lines(root: ModelVersion) -> list[str]:
    """The report as a few terminal lines: per iteration held-out success [95 % CI], SFT share, acceptance."""
    from .demo_report import build_report

    report = build_report(root)
    lines = [f"{'it':>2} {'held-out success':>26} {'→ SFT':>12} {'accepted':>12} {'promoted':>8} {'wall s':>7}"]
    for row in report["iterations"]:
        o = (row["heldout"] or {}).get("overall") or {}
        held = f"{o.get('successes', 0)}/{o.get('n', 0)} [{o.get('ci_low', 0):.2f},{o.get('ci_high', 1):.2f}]"
        share = row["sft_share"]
        accepted = row["acceptance"] or {}
        acc = f"{accepted.get('accepted', 0)}/{accepted.get('n', 0)}" if accepted else "—"
        lines.append(f"{row['number']:>2} {held:>26} {share['successes']:>5}/{share['n']:<6} {acc:>12} "
                     f"{row['promoted']!s:>8} {row['wall_s'] or 0:>7.0f}")  # fmt: skip
    goals = report["goals"]
    if goals:
        for who, g in (("last", goals), (f"kept (it {goals['kept']['number']})", goals["kept"])):
            ratio = "—" if g["ratio"] is None else f"x{g['ratio']:.2f}"
            lines.append(f"{who} vs it 0: {ratio}, doubled {g['doubled']}, intervals apart {g['intervals_apart']}")
        share, accepted = (f"{goals[k]} (within CI {goals[k + '_within_ci']})"
                           for k in ("sft_share_rising", "acceptance_rising"))  # fmt: skip
        lines.append(f"SFT share rising {share}, acceptance rising {accepted}, "
                     f"within {goals['time_limit_s'] / 60:.0f} min {goals['within_time']}")  # fmt: skip
    return lines


def plan_from_options(options: dict[str, Any]) -> DemoPlan:
    """The plan the command's options ask for (`families` comma-separated; empty: the plan's own)."""
    families = [f.strip() for f in (options.get("families") or "").split(",") if f.strip()] or None
    overrides: dict[str, Any] = {}  # None: the plan's own
    if options.get("drills") is not None:
        overrides["drills"] = options["drills"]
    if options.get("bootstrap") is not None:
        overrides["bootstrap_per_family"] = options["bootstrap"]
    plan = make_plan(quick=options["quick"], seed=options["seed"], families=families,
                     iterations=options.get("iterations"), **overrides)  # fmt: skip
    temperature = options.get("rft_temperature")
    if temperature is not None:
        plan = replace(plan, rft={**plan.rft, "temperature": temperature})
        try:  # RFT's own check, now rather than when iteration 1's RFT stage starts, half an hour in
            check_rft_config(plan.rft)
        except ValueError as exc:
            raise DemoError(f"--rft-temperature {temperature:g}: {exc}") from None
    if options.get("levels"):
        try:
            levels = tuple(sorted({int(level) for level in options["levels"].split(",") if level.strip()}))
        except ValueError:
            raise DemoError(f"--levels takes comma-separated numbers such as 1,2; got {options['levels']!r}") from None
        plan = with_levels(plan, levels)
    return with_iteration_sizes(plan, options.get("annotate"), options.get("rft_tasks"))


def with_iteration_sizes(plan: DemoPlan, annotate: int | None, rft_tasks: int | None) -> DemoPlan:
    """`plan` with `annotate` instances of each family done live and `rft_tasks` sampled by RFT every iteration
    (None: the plan's own), and enough training instances at its levels that no iteration repeats one. The first
    instances stay the plan's, so the bootstrap and iteration 0 are the same as without these options."""
    sizes = {}
    for option, value, field_ in (("--annotate", annotate, "annotate_per_iteration"),
                                  ("--rft-tasks", rft_tasks, "rft_tasks_per_iteration")):  # fmt: skip
        if value is None:
            continue
        if not 0 <= value <= MAX_PER_FAMILY:
            raise DemoError(f"{option} takes 0 to {MAX_PER_FAMILY} instances per family, got {value}")
        sizes[field_] = value * len(plan.families)
    plan = replace(plan, **sizes)
    per_family = -(-(plan.annotate_per_iteration + plan.rft_tasks_per_iteration) // len(plan.families))
    needed = (plan.bootstrap_per_family or 0) + plan.iterations * per_family  # of each family, all levels together
    return replace(plan, train_per_family=max(plan.train_per_family, -(-needed // len(plan.levels))))


def with_levels(plan: DemoPlan, levels: tuple[int, ...]) -> DemoPlan:
    """`plan` at difficulty `levels`, its training and held-out instances per family shared among them (each level
    has as many), so that the run's size and time stay the plan's. Each family must have every level."""
    lacking = [name for name in plan.families if not set(levels) <= set(family(name).levels)]
    if not levels or lacking:
        known = ", ".join(f"{name} {'/'.join(map(str, family(name).levels))}" for name in plan.families)
        raise DemoError(f"levels {','.join(map(str, levels)) or '(none)'} are not all had by every family ({known})")
    share = len(levels)
    return replace(plan, levels=levels, train_per_family=max(1, plan.train_per_family // share),
                   heldout_per_family=max(1, plan.heldout_per_family // share))  # fmt: skip


def run_demo_command(stdout: Any, options: dict[str, Any]) -> ModelVersion:
    """`manage.py flywheel demo`: check the stack, run the demonstration with a progress bar, write the results.
    DemoError says what stopped it (the command prints it as its error)."""
    import os

    base_url = options.get("base_url") or f"http://127.0.0.1:{os.environ.get('WEB_PORT', '8000')}"
    plan = plan_from_options(options)
    problems = waited(lambda: check_stack(base_url), float(options.get("wait") or 0))
    if problems:
        needs = "the demonstration needs the stack up (scripts/demo-flywheel starts it)"
        raise DemoError(f"{needs}: {'; '.join(problems)}")
    stdout.write(f"flywheel demonstration: {json_plan(plan)}")
    bar = TerminalProgress(plan, stdout._out if hasattr(stdout, "_out") else stdout, BOOTSTRAP_STAGES, LOOP_STAGES)
    started = time.monotonic()
    try:
        root = run_demo(plan, base_url, bar)
    finally:
        bar.close()
    out = Path(options.get("out") or Path(settings.BASE_DIR) / "var" / "demo" / root.name)
    report_json, report_png = write_results(root, out)
    for line in summary_lines(root):
        stdout.write(line)
    stdout.write(f"done in {time.monotonic() - started:.0f} s; {report_json}, {report_png}; the page: "
                 f"{base_url}/flywheel/demo/?root={root.pk}")  # fmt: skip
    return root


# --- the default annotation model of scripts/run -------------------------------------------------------------------

DEFAULT_NAME = "suite-agent"  # served name of the default agent, and its registry name's stem
# The demonstration that trains it: the quick sizes on the full plan's six browser families, one iteration, so it has
# seen every browser family of the demo data, from a base pre-trained on the full plan's grounding drills: without
# them it picks among a page's elements at chance (6/24 held-out; docs/flywheel.md, "The default model").
DEFAULT_PLAN = {"quick": True, "families": ",".join(DEFAULT_AGENT_FAMILIES), "iterations": 1, "drills": FULL_DRILLS}
REPLACEABLE = ("tiny-uitars-embedded",)  # active models the default agent may replace (the random one seed_demo adds)


def default_dir() -> Path:
    return Path(settings.BASE_DIR) / "var" / "models" / DEFAULT_NAME


def best_model(root: ModelVersion) -> ModelVersion:
    """The demonstration's model to keep: the active one when it descends from `root`, else its best evaluated one."""
    from .demo_report import lineage

    models = lineage(root)
    # from the database: the caller's `root` may be the object the run promoted at its start, still marked active
    active = ModelVersion.objects.filter(pk__in=[m.pk for m in models], is_active=True).first()
    if active is not None:
        return active
    rated = [m for m in models if registry.held_out_rate(m) is not None]
    return max(rated, key=lambda m: (registry.held_out_rate(m), m.pk)) if rated else root


def install_default(root: ModelVersion) -> Path:
    """Copy the demonstration's best model to var/models/suite-agent (the cache later starts serve), with where it
    came from in `provenance.json`."""
    import json
    import shutil

    model = best_model(root)
    target, staging = default_dir(), default_dir().with_name(DEFAULT_NAME + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(model.checkpoint_uri, staging, symlinks=False)
    provenance = {"model": model.name, "root": root.name, "evaluation": model.evaluation, "copied_at": timezone.now()}
    (staging / "provenance.json").write_text(json.dumps(provenance, indent=1, default=str))
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def serve_default() -> ModelVersion:
    """Serve var/models/suite-agent from the embedded policy server (under its `--models-root var/models`), register
    it as `suite-agent-embedded` and make it the annotation model unless a model other than the random tiny one (or a
    demonstration's) is active."""
    path = default_dir()
    problem = registry.load_into_embedded_server(DEFAULT_NAME, str(path), replace=True)
    if problem:
        raise DemoError(f"the policy server cannot serve {path}: {problem}")
    notes = "The suite's agent, trained by the flywheel demonstration; see var/models/suite-agent/provenance.json."
    model, _ = ModelVersion.objects.update_or_create(
        name=f"{DEFAULT_NAME}-embedded",
        defaults={"checkpoint_uri": str(path), "endpoint_url": settings.EMBEDDED_POLICY_URL,
                  "served_name": DEFAULT_NAME, "notes": notes},
    )  # fmt: skip
    from .demo_report import lineage, roots

    active = ModelVersion.objects.filter(is_active=True).first()
    demo_models = {m.pk for root in roots() for m in lineage(root)}  # not served after a restart anyway
    if active is None or (active.pk != model.pk and (active.name in REPLACEABLE or active.pk in demo_models)):
        registry.promote(model, by=None, reason="the default agent of scripts/run (var/models/suite-agent)")
    return model


def run_default_agent_command(stdout: Any, options: dict[str, Any]) -> None:
    """`manage.py flywheel default-agent`: on the first start, train the suite agent with a short demonstration
    (`DEFAULT_PLAN`) and cache it under var/models/suite-agent; on every start, serve the cached one and make it the
    annotation model."""
    if options.get("retrain") or not (default_dir() / "config.json").is_file():
        stdout.write(f"no default agent in {default_dir()} yet: training it with a short demonstration")
        root = run_demo_command(stdout, {**options, **DEFAULT_PLAN, "seed": options.get("seed") or 0})
        stdout.write(f"default agent cached in {install_default(root)}")
    problems = waited(lambda: unanswered([policy_check()]), float(options.get("wait") or 0))
    if problems:  # scripts/run starts this beside the stack: the policy server may still be loading its model
        raise DemoError("; ".join(problems))
    model = serve_default()
    stdout.write(f"the default agent {model.name} serves live proposals (active: {model.is_active})")
