"""Rejection sampling (RFT, UI-TARS-2 §2.3): the iteration's base model plays each chosen verifiable task N times in
leased sandboxes; every attempt is stored as a Trajectory(mode=rollout) scored by the task's verifier, and the
iteration's validation then routes it like any other trajectory (a verified success can reach SFT, the rest CT).

`run_rft(iteration, progress)` is the stage (a Celery task on the `sandbox` queue calls it); `check_rft_config` fills
and checks config["rft"]. Attempts run in threads (flywheel.rft_attempt), as many at once as the sandbox service
gives sessions. Idempotent: an attempt is named by (iteration, task, attempt number) in its metadata; a finished one
is skipped on a rerun, one left in progress by a crash is marked abandoned (its lease released) and played again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from annotation_app.live.sessions import release_quietly, sandbox_as
from annotation_app.models import Task, Trajectory

from .locks import advisory_lock
from .models import Iteration, ModelVersion
from .rft_attempt import AttemptResult, AttemptSpec, CapacityGate, RolloutSettings, SessionShelf, run_attempt

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "tasks": [],  # task ids; empty: every eligible task
    "domains": [],  # task domains; empty: all
    "attempts": 4,  # N: attempts per task
    "max_steps": 15,  # model turns per attempt (SandboxEnv's budget)
    "temperature": 1.0,
    "max_tokens": 256,
    "concurrency": None,  # attempts at once; None: as many as the sandbox service has free (up to AUTO_CONCURRENCY)
    "constrain": True,  # grammar-constrained decoding, as live proposals: every reply parses
    "keep_images": 5,  # screenshots sent per turn (the last N), as UI-TARS-1.5 was trained
    "seed": None,  # an integer seeds every request from (seed, task, attempt, turn): a rerun samples the same replies
    "keep_sessions": True,  # browser attempts hand their session on, reset, instead of starting a Chromium each
}
LIMITS = {"attempts": (1, 64), "max_steps": (1, 100), "max_tokens": (16, 4096), "concurrency": (1, 64),
          "keep_images": (1, 50), "seed": (0, 2**31 - 1)}  # fmt: skip
OPTIONAL = ("concurrency", "seed")  # None: as many as the sandbox has free / unseeded
AUTO_CONCURRENCY = 8  # threads when concurrency is not set; those beyond the sandbox's free capacity wait for a slot
PROGRESS_EVERY_S = 1.0  # how often progress (and so a cancel request) is looked at while attempts run
LEASE_TTL_S = 900.0  # a crashed run's sessions come back to the pool at the latest after this
CAPACITY_WAIT_S = 600.0
PLATFORMS = (Task.Platform.DESKTOP, Task.Platform.BROWSER)  # what the sandbox service can run
MAX_ERRORS = 20  # error lines kept in the stage's output
_UNFINISHED = [Trajectory.Status.IN_PROGRESS, Trajectory.Status.ABANDONED]  # attempts a rerun plays again


class RFTError(ValueError):
    """The RFT stage cannot run as configured; the message says why."""


def check_rft_config(d: dict[str, Any] | None) -> dict[str, Any]:
    """config["rft"] with defaults filled in; ValueError names the setting that is wrong."""
    d = dict(d or {})
    unknown = sorted(set(d) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown RFT setting(s): {', '.join(unknown)} (known: {', '.join(sorted(DEFAULTS))})")
    out = {**DEFAULTS, **d}
    for name, (low, high) in LIMITS.items():
        value = out[name]
        if value is None and name in OPTIONAL:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"rft.{name} must be an integer from {low} to {high}, got {value!r}")
    temperature = out["temperature"]
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise ValueError(f"rft.temperature must be a number from 0 to 2, got {temperature!r}")
    out["temperature"] = float(temperature)
    for name in ("constrain", "keep_sessions"):
        if not isinstance(out[name], bool):
            raise ValueError(f"rft.{name} must be true or false")
    tasks = out["tasks"]
    if not isinstance(tasks, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tasks):
        raise ValueError("rft.tasks must be a list of task ids (positive integers)")
    domains = out["domains"]
    if not isinstance(domains, list) or not all(isinstance(x, str) and x.strip() for x in domains):
        raise ValueError("rft.domains must be a list of non-empty domain names")
    out["tasks"], out["domains"] = sorted(set(tasks)), sorted({x.strip() for x in domains})
    return out


def eligible_tasks() -> QuerySet[Task]:
    """Tasks RFT may train on: with an evaluator, not held out for evaluation (metadata.split), not archived, on a
    platform the sandbox runs."""
    return (
        Task.objects.exclude(evaluator={})
        .filter(~Q(metadata__contains={"split": "heldout"}), platform__in=PLATFORMS)
        .exclude(status=Task.Status.ARCHIVED)
    )


def select_tasks(config: dict[str, Any]) -> list[Task]:
    """The tasks of this run (config as check_rft_config returns it); RFTError when none, or when a named task is
    not eligible (each named with why)."""
    queryset = eligible_tasks()
    if config["domains"]:
        queryset = queryset.filter(domain__in=config["domains"])
    if config["tasks"]:
        queryset = queryset.filter(pk__in=config["tasks"])
        tasks = list(queryset.order_by("pk"))
        missing = sorted(set(config["tasks"]) - {t.pk for t in tasks})
        if missing:
            raise RFTError("task(s) " + "; ".join(_why_not(pk, config) for pk in missing))
        return tasks
    tasks = list(queryset.order_by("pk"))
    if not tasks:
        where = f" in domain(s) {', '.join(config['domains'])}" if config["domains"] else ""
        raise RFTError(f"no task to roll out{where}: RFT needs tasks with an evaluator that are not held out")
    return tasks


def _why_not(pk: int, config: dict[str, Any]) -> str:
    task = Task.objects.filter(pk=pk).first()
    if task is None:
        return f"{pk}: does not exist"
    if not task.evaluator:
        return f"{pk}: has no evaluator"
    if task.metadata.get("split") == "heldout":
        return f"{pk}: is held out for evaluation"
    if task.status == Task.Status.ARCHIVED:
        return f"{pk}: is archived"
    if task.platform not in PLATFORMS:
        return f"{pk}: runs on {task.platform}, which the sandbox does not provide"
    return f"{pk}: is not in domain(s) {', '.join(config['domains'])}"


def base_model(iteration: Iteration) -> ModelVersion:
    """The model that plays: the iteration's base model, which must be served (RFTError otherwise)."""
    model = iteration.base_model
    if model is None:
        raise RFTError("the iteration has no base model: RFT needs a registered model with an endpoint")
    if not model.endpoint_url:
        raise RFTError(f"model {model.name!r} has no endpoint URL: register where it is served to run RFT with it")
    return model


def rollouts_of(iteration: Iteration) -> QuerySet[Trajectory]:
    """The RFT trajectories an iteration made (all statuses)."""
    return Trajectory.objects.filter(mode=Trajectory.Mode.ROLLOUT, metadata__rft__iteration=iteration.pk)


def _key(trajectory: Trajectory) -> tuple[int, int]:
    return trajectory.task_id, int(trajectory.metadata["rft"]["attempt"])


def settle_half_written(iteration: Iteration) -> int:
    """Attempts a crashed run left in progress: their sessions released, their trajectories abandoned (so they are
    played again). How many."""
    left = list(rollouts_of(iteration).filter(status=Trajectory.Status.IN_PROGRESS))
    for trajectory in left:
        session = trajectory.metadata.get("rft", {}).get("session")
        if session:
            client = sandbox_as(trajectory.metadata["rft"].get("owner") or f"trajectory:{trajectory.pk}")
            try:
                release_quietly(client, session)
            finally:
                client.close()
        metadata = {**trajectory.metadata, "end_reason": "interrupted: redone by a later run"}
        Trajectory.objects.filter(pk=trajectory.pk, status=Trajectory.Status.IN_PROGRESS).update(
            status=Trajectory.Status.ABANDONED, metadata=metadata, updated_at=timezone.now()
        )
    return len(left)


def run_rft(iteration: Iteration, progress: Callable[[int, int | None], None]) -> dict[str, Any]:
    """Play every attempt of config["rft"] not stored yet and return the stage's output. `progress(done, total)` is
    called as attempts finish (and every PROGRESS_EVERY_S); whatever it raises (the iteration's Cancelled) stops the
    run: attempts in flight stop at their next turn, their leases are released, then it propagates."""
    try:
        config = check_rft_config(iteration.config.get("rft"))
    except ValueError as exc:
        raise RFTError(f"config.rft: {exc}") from None
    model = base_model(iteration)
    tasks = select_tasks(config)
    with advisory_lock(f"flywheel.rft.{iteration.pk}") as mine:
        if not mine:
            raise RFTError(f"the RFT stage of iteration {iteration.pk} is already running in another worker")
        redone = settle_half_written(iteration)
        stored = {_key(t) for t in rollouts_of(iteration).exclude(status__in=_UNFINISHED)}
        plan = [
            AttemptSpec(iteration.pk, task.pk, attempt, model.pk)
            for attempt in range(config["attempts"])
            for task in tasks
            if (task.pk, attempt) not in stored
        ]
        total = len(tasks) * config["attempts"]
        shelf = SessionShelf(f"rft:{iteration.pk}", keep=config["keep_sessions"])
        results = _play_all(plan, _settings(config), config["concurrency"], total - len(plan), total, progress, shelf)
    errors = [f"task {r.spec.task_id} attempt {r.spec.attempt}: {r.error}" for r in results if r.error]
    if plan and len(errors) == len(plan):
        raise RFTError(f"every attempt failed ({len(plan)}); the first: {errors[0]}")
    output = summary(iteration, tasks, config["attempts"], skipped=total - len(plan), redone=redone, errors=errors)
    return {**output, "browser_sessions": {"attempts": shelf.attempts, "leased": shelf.leased}}


def _settings(config: dict[str, Any]) -> RolloutSettings:
    return RolloutSettings(
        max_steps=config["max_steps"], temperature=config["temperature"], max_tokens=config["max_tokens"],
        constrain=config["constrain"], keep_images=config["keep_images"], lease_ttl_s=LEASE_TTL_S,
        capacity_wait_s=CAPACITY_WAIT_S, seed=config["seed"],
    )  # fmt: skip


def _play_all(plan: list[AttemptSpec], run: RolloutSettings, concurrency: int | None, done: int, total: int,
              progress: Callable[[int, int | None], None], shelf: SessionShelf) -> list[AttemptResult]:  # fmt: skip
    """Run the attempts in threads, reporting progress from this thread; on any exception here (a cancel from
    `progress`, Ctrl-C) the attempts stop and are waited for (each releases its lease or shelves its browser) before
    it propagates. Browser attempts hand their sessions on through `shelf`, which is emptied at the end."""
    progress(done, total)
    if not plan:
        return []
    workers = max(1, min(len(plan), concurrency or AUTO_CONCURRENCY))
    stop, gate = threading.Event(), CapacityGate(run.capacity_wait_s)
    results: list[AttemptResult] = []
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rft")
    try:
        pending: set[Future[AttemptResult]] = {pool.submit(run_attempt, spec, run, gate, stop, shelf)
                                               for spec in plan}  # fmt: skip
        while pending:
            finished, pending = wait(pending, timeout=PROGRESS_EVERY_S, return_when=FIRST_COMPLETED)
            for future in finished:
                results.append(future.result())
                if not results[-1].error:
                    done += 1
            progress(done, total)
    except BaseException:
        stop.set()
        gate.released()  # wake attempts waiting for capacity: they see the stop
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shelf.drain()
    return results


def summary(iteration: Iteration, tasks: list[Task], attempts: int, *, skipped: int, redone: int,
            errors: list[str]) -> dict[str, Any]:  # fmt: skip
    """The stage's output from what is stored: attempts, successes (outcome 1), success rate, per task, errors."""
    wanted = {(t.pk, k) for t in tasks for k in range(attempts)}
    by_task: dict[str, dict[str, Any]] = {
        str(t.pk): {"external_id": t.external_id, "attempts": 0, "successes": 0, "unscored": 0} for t in tasks
    }
    stored = 0
    for trajectory in rollouts_of(iteration).exclude(status__in=_UNFINISHED).only("task_id", "metadata",
                                                                                   "outcome_reward"):  # fmt: skip
        if _key(trajectory) not in wanted:
            continue
        entry = by_task[str(trajectory.task_id)]
        entry["attempts"] += 1
        stored += 1
        if trajectory.outcome_reward is None:
            entry["unscored"] += 1
        elif trajectory.outcome_reward >= 1.0:
            entry["successes"] += 1
    successes = sum(e["successes"] for e in by_task.values())
    for entry in by_task.values():
        entry["success_rate"] = round(entry["successes"] / entry["attempts"], 4) if entry["attempts"] else None
    return {
        "planned": len(wanted),
        "attempts": stored,
        "successes": successes,
        "success_rate": round(successes / stored, 4) if stored else None,
        "skipped": skipped,
        "redone": redone,
        "by_task": by_task,
        "errors": errors[:MAX_ERRORS],
        "error_count": len(errors),
    }
