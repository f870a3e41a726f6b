"""Flywheel iterations: start, cancel and run them stage by stage, and the validation+routing stage itself.

Every state change is a function here that writes the row and pushes the event (`flywheel_iteration` to the ML
engineers' and data leads' pages); views, the API, the command and the Celery tasks only parse and call. Stages are
idempotent: a stage recorded as done is skipped, validation resumes after the last trajectory it validated (the
(iteration, trajectory) pair is unique, and inserts ignore conflicts), and export skips a store version it made.

Where stages run: VALIDATE and EXPORT in `run_iteration` itself (the `flywheel` queue). RFT (the `sandbox` queue) and
CT, SFT, VALUE, PPO, EVALUATE (the `train` queue) are "remote": `run_iteration` marks the next one `queued`, sends its
stage task and returns, so no worker waits on another queue; the stage task (`run_remote_stage`) runs it under a
per-(iteration, stage) advisory lock, skips it when done, and sends `flywheel.run_iteration` again, which goes on with
the next stage. A runner that died (kill -9) is noticed by `requeue_stalled` (a beat task): the running stage's
heartbeat is older than FLYWHEEL_STALL_S and nobody holds its lock, so the iteration is queued again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from celery import current_app
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, JSONObject
from django.utils import timezone

from annotation_app.models import Review, Step, Trajectory
from annotation_app.step_edits import open_bad_verdicts

from .formats import PARQUET_IMAGES
from .locks import advisory_lock
from .models import AVAILABLE_STAGES, DatasetVersion, Iteration, ModelVersion, Route, Stage, Validation
from .orm import OrmConfig, attach_orm_scores
from .progress import EVENT, Cancelled, IterationError, as_json, progress, push, state_of  # noqa: F401 (re-exported)
from .validation import Review as ReviewSignal
from .validation import Signals, VConfig, Verdict, trajectory_flag_names, validate

log = logging.getLogger(__name__)

CHUNK = 2000  # trajectories per round trip: a constant number of queries per chunk, whatever the step count
RUN_TASK = "flywheel.run_iteration"  # flywheel.tasks.run_iteration_task, on the `flywheel` queue
COORDINATES = ("absolute", "relative1000")
# Stages that run on a queue of their own (CELERY_TASK_ROUTES routes by the task name's prefix); the rest run in
# run_iteration on the `flywheel` queue.
QUEUES = {
    Stage.RFT: "sandbox",
    Stage.CT: "train",
    Stage.SFT: "train",
    Stage.VALUE: "train",
    Stage.PPO: "train",
    Stage.EVALUATE: "train",
}
STAGE_TASKS = {"sandbox": "sandbox.flywheel_stage", "train": "training.flywheel_stage"}  # flywheel/tasks.py
TRAINING_STAGES = (Stage.CT, Stage.SFT, Stage.VALUE, Stage.PPO)
PROMOTE = ("manual", "auto")
SECTIONS = ("v", "export", "rft", "orm", "train", "evaluate", "promote")


# --- starting and cancelling ---------------------------------------------------------------------------------------


def check_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """The iteration config with defaults filled in: {"v": VConfig, "export": {"coordinates"}, "train": trainer
    preset and options, "evaluate": episodes…, "promote": "manual"|"auto", "rft" and "orm" when their modules are
    installed}; IterationError names what is wrong. One checker per section, so a new section is one more line."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
        raise IterationError(f"unknown config section(s): {', '.join(unknown)} (known: {', '.join(sorted(SECTIONS))})")
    checked = _check_core(config)
    from .training_stages import check_evaluate_config, check_train_config

    checked["train"] = _section("train", check_train_config, config.get("train"))
    checked["evaluate"] = _section(
        "evaluate", lambda raw: check_evaluate_config(raw, checked["train"]["preset"]), config.get("evaluate")
    )
    promote = config.get("promote", "manual")
    if promote not in PROMOTE:
        raise IterationError("config.promote must be 'manual' or 'auto' (promote when the evaluation beats the active)")
    checked["promote"] = promote
    optional = (("rft", "flywheel.rft", "check_rft_config"), ("orm", "flywheel.orm", "check_orm_config"))
    for name, module, function in optional:
        checker = _optional(module, function)
        if checker is not None:
            checked[name] = _section(name, checker, config.get(name))
        elif name in config:
            if not isinstance(config[name], dict):
                raise IterationError(f"config.{name} must be an object")
            checked[name] = config[name]
    return checked


def _section(name: str, checker: Callable[[Any], dict[str, Any]], raw: Any) -> dict[str, Any]:
    """A section through its checker; its ValueError or TypeError becomes IterationError("config.<name>: …")."""
    if raw is not None and not isinstance(raw, dict):
        raise IterationError(f"config.{name} must be an object")
    try:
        return checker(raw)
    except (TypeError, ValueError) as exc:
        raise IterationError(f"config.{name}: {exc}") from None


def _optional(module: str, function: str) -> Callable[..., Any] | None:
    """A function of a module another part of the flywheel provides, or None while it is not installed."""
    import importlib

    try:
        return getattr(importlib.import_module(module), function, None)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None


def _check_core(config: dict[str, Any]) -> dict[str, Any]:
    """The validation (v) and export sections."""
    try:
        v = VConfig.from_dict(config.get("v"))
    except (TypeError, ValueError) as exc:
        raise IterationError(f"config.v: {exc}") from None
    export = dict(config.get("export") or {})
    if sorted(set(export) - {"coordinates", "parquet_images"}):
        raise IterationError("config.export takes only 'coordinates' and 'parquet_images'")
    coordinates = export.get("coordinates", "absolute")
    if coordinates not in COORDINATES:
        raise IterationError(f"config.export.coordinates must be one of {', '.join(COORDINATES)}")
    parquet_images = export.get("parquet_images", "bytes")
    if parquet_images not in PARQUET_IMAGES:
        raise IterationError(f"config.export.parquet_images must be one of {', '.join(PARQUET_IMAGES)}")
    for version in latest_versions().values():
        frame = version.manifest.get("coordinates")
        if frame and frame != coordinates:
            raise IterationError(
                f"the {version.get_kind_display()} store is in {frame} coordinates; an export appends to it in the "
                f"same frame (set config.export.coordinates to {frame!r})"
            )
    return {"v": v.to_dict(), "export": {"coordinates": coordinates, "parquet_images": parquet_images}}


def check_stages(stages: list[str], base_model: ModelVersion | None, config: dict[str, Any]) -> None:
    """Refuse a combination of stages that cannot run, saying why (IterationError)."""
    selected = set(stages)
    trains = [s for s in TRAINING_STAGES if s in selected]
    if Stage.EXPORT in selected and Stage.VALIDATE not in selected:
        raise IterationError("export needs the validation and routing stage")
    if (trains or Stage.EVALUATE in selected) and (base_model is None or not base_model.checkpoint_uri):
        raise IterationError("training and evaluation stages need a base model with a checkpoint")
    for kind in (Stage.CT, Stage.SFT):
        if kind in selected and Stage.EXPORT not in selected and not DatasetVersion.objects.filter(kind=kind).exists():
            raise IterationError(
                f"{Stage(kind).label} needs data: select the export stage, or export to the {kind.upper()} store first"
            )
    if Stage.VALUE in selected and Stage.PPO not in selected:
        raise IterationError("value pretraining only makes PPO's critic: select PPO too")
    if Stage.EVALUATE in selected and not [s for s in (Stage.CT, Stage.SFT, Stage.PPO) if s in selected]:
        raise IterationError("evaluation compares the model this iteration trains with its base: select CT, SFT or PPO")
    if config.get("promote") == "auto" and Stage.EVALUATE not in selected:
        raise IterationError("automatic promotion needs the evaluation stage")
    from .training_stages import heldout_tasks, ppo_tasks

    if selected & {Stage.VALUE, Stage.PPO} and not ppo_tasks(config):
        raise IterationError("PPO needs verifiable training tasks (tasks with an evaluator, not held out); none match")
    if Stage.EVALUATE in selected and not heldout_tasks(config):
        raise IterationError('evaluation needs held-out tasks (with an evaluator and metadata.split "heldout")')


def latest_versions() -> dict[str, DatasetVersion]:
    """The newest version of each store."""
    found: dict[str, DatasetVersion] = {}
    for version in DatasetVersion.objects.order_by("kind", "-number").distinct("kind"):
        found[version.kind] = version
    return found


def start_iteration(
    user: Any,
    *,
    base_model: ModelVersion | None = None,
    scope: str = Iteration.Scope.NEW,
    modes: list[str] | None = None,
    domains: list[str] | None = None,
    date_from: datetime | None = None,
    date_to: datetime | None = None,
    stages: list[str] | None = None,
    config: dict[str, Any] | None = None,
    enqueue: bool = True,
) -> Iteration:
    """Record a new iteration and (with `enqueue`) queue it on the `flywheel` Celery queue once committed."""
    stages = list(stages or [Stage.VALIDATE, Stage.EXPORT])
    unknown = [s for s in stages if s not in Stage.values]
    if unknown:
        raise IterationError(f"unknown stage(s): {', '.join(unknown)}")
    missing = [s for s in stages if s not in AVAILABLE_STAGES]
    if missing:
        raise IterationError(f"not available yet: {', '.join(Stage(s).label for s in missing)}")
    bad_modes = [m for m in modes or [] if m not in Trajectory.Mode.values]
    if bad_modes:
        raise IterationError(f"unknown mode(s): {', '.join(bad_modes)}")
    if scope not in Iteration.Scope.values:
        raise IterationError(f"scope must be one of {', '.join(Iteration.Scope.values)}")
    if date_from and date_to and date_from >= date_to:
        raise IterationError("date_from must be before date_to")
    checked = check_config(config)
    check_stages(stages, base_model, checked)
    ordered = [s for s in Stage.values if s in stages]
    iteration = Iteration.objects.create(
        started_by=user if getattr(user, "pk", None) else None,
        base_model=base_model,
        scope=scope,
        modes=list(modes or []),
        domains=[d for d in domains or [] if d],
        date_from=date_from,
        date_to=date_to,
        selected_stages=ordered,
        config=checked,
        stages={s: {"status": "pending", "done": 0, "total": None} for s in ordered},
    )
    if enqueue:  # by name: domain code never imports a task module (flywheel/tasks.py)
        transaction.on_commit(lambda: current_app.send_task(RUN_TASK, args=[iteration.pk]))
    push(iteration)
    return iteration


def cancel_iteration(iteration: Iteration) -> Iteration:
    """Ask a running iteration to stop (it stops at its next chunk); a pending one is cancelled at once."""
    with transaction.atomic():
        iteration = Iteration.objects.select_for_update().get(pk=iteration.pk)
        if iteration.finished:
            raise IterationError(f"iteration {iteration.pk} has already {iteration.status}")
        iteration.cancel_requested = True
        fields = ["cancel_requested"]
        waiting = any(e.get("status") == "queued" for e in iteration.stages.values())
        if iteration.status == Iteration.Status.PENDING or waiting:  # nothing runs it now: cancelled at once
            for entry in iteration.stages.values():
                if entry.get("status") == "queued":
                    entry["status"] = Iteration.Status.CANCELLED
            iteration.status, iteration.finished_at = Iteration.Status.CANCELLED, timezone.now()
            fields += ["status", "finished_at", "stages"]
        iteration.save(update_fields=fields)
    push(iteration)
    return iteration


def reopen_iteration(iteration: Iteration) -> Iteration:
    """Make a failed or cancelled iteration runnable again (its stages done stay done): an operator's retry."""
    with transaction.atomic():
        iteration = Iteration.objects.select_for_update().get(pk=iteration.pk)
        if iteration.status not in (Iteration.Status.FAILED, Iteration.Status.CANCELLED):
            raise IterationError(
                f"iteration {iteration.pk} is {iteration.status}; only failed or cancelled ones reopen"
            )
        iteration.status, iteration.error, iteration.cancel_requested = Iteration.Status.PENDING, "", False
        iteration.finished_at = None
        iteration.save(update_fields=["status", "error", "cancel_requested", "finished_at"])
    push(iteration)
    return iteration


# --- running ---------------------------------------------------------------------------------------------------------


def iteration_lock(iteration_id: int) -> str:
    return f"flywheel.iteration.{iteration_id}"


def stage_lock(iteration_id: int, stage: str) -> str:
    return f"flywheel.iteration.{iteration_id}.{stage}"


def run_iteration(iteration_id: int, *, chunk: int = CHUNK, remote: bool = True) -> Iteration:
    """Run the selected stages not done yet, in order: local ones here; the next remote one (RFT, training,
    evaluation) is queued for its worker, which comes back here when it is done — unless `remote` is False, then every
    stage runs in this process. The iteration ends succeeded, failed or cancelled. Safe to call again after a crash (a
    concurrent call for the same iteration returns at once)."""
    with advisory_lock(iteration_lock(iteration_id)) as mine:
        iteration = Iteration.objects.get(pk=iteration_id)
        if not mine or iteration.finished:
            return iteration
        if iteration.cancel_requested:
            return _finish(iteration, Iteration.Status.CANCELLED)
        iteration.status = Iteration.Status.RUNNING
        iteration.started_at = iteration.started_at or timezone.now()
        iteration.save(update_fields=["status", "started_at"])
        push(iteration)
        try:
            for stage in iteration.selected_stages:
                if iteration.stages.get(stage, {}).get("status") == "done":
                    continue
                if stage not in QUEUES:
                    _run_stage(iteration, stage, chunk)
                elif remote:
                    _dispatch(iteration, stage)
                    return iteration
                else:
                    with advisory_lock(stage_lock(iteration_id, stage)) as free:
                        if not free:  # its worker runs it; that worker carries on afterwards
                            return iteration
                        _run_stage(iteration, stage, chunk)
        except Cancelled:
            return _finish(iteration, Iteration.Status.CANCELLED)
        except Exception as exc:
            log.exception("iteration %s failed", iteration_id)
            return _finish(iteration, Iteration.Status.FAILED, f"{type(exc).__name__}: {exc}")
        return _finish(iteration, Iteration.Status.SUCCEEDED)


def run_remote_stage(iteration_id: int, stage: str) -> str:
    """What a stage task on the `sandbox` or `train` queue does: run the stage (unless another runner holds it, or it
    is done), then queue `flywheel.run_iteration` to go on. Returns what happened."""
    with advisory_lock(stage_lock(iteration_id, stage)) as mine:
        if not mine:
            return "busy"  # the holder carries on when it is done
        iteration = Iteration.objects.get(pk=iteration_id)
        if iteration.finished:
            return iteration.status
        if stage not in iteration.selected_stages:
            raise IterationError(f"iteration {iteration_id} has no stage {stage!r}")
        if iteration.cancel_requested:
            return _finish(iteration, Iteration.Status.CANCELLED).status
        if iteration.stages.get(stage, {}).get("status") == "done":
            if iteration.current_stage != stage:
                return "done already"  # a duplicate message: the iteration has gone on without it
        else:
            try:
                _run_stage(iteration, stage, CHUNK)
            except Cancelled:
                return _finish(iteration, Iteration.Status.CANCELLED).status
            except Exception as exc:
                log.exception("iteration %s: stage %s failed", iteration_id, stage)
                return _finish(iteration, Iteration.Status.FAILED, f"{type(exc).__name__}: {exc}").status
    current_app.send_task(RUN_TASK, args=[iteration_id])
    return "done"


def _dispatch(iteration: Iteration, stage: str) -> None:
    """Queue a remote stage for its worker, marked `queued` — unless a live runner holds it (it goes on when done)."""
    if _held(stage_lock(iteration.pk, stage)):
        return
    queue, now = QUEUES[stage], timezone.now().isoformat()
    merge_entry(iteration, stage, {"status": "queued", "queue": queue, "queued_at": now, "heartbeat": now})
    iteration.current_stage = stage
    iteration.save(update_fields=["current_stage"])
    push(iteration)
    current_app.send_task(STAGE_TASKS[queue], args=[iteration.pk, stage])


def merge_entry(iteration: Iteration, stage: str, values: dict[str, Any]) -> None:
    """Set keys of one stage's entry, in the row (jsonb, leaving the other stages as they are) and in `iteration`."""
    iteration.stages.setdefault(stage, {}).update(values)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Iteration._meta.db_table} SET stages = jsonb_set(stages, %s, "
            "coalesce(stages -> %s, '{}'::jsonb) || %s::jsonb) WHERE id = %s",
            [[stage], stage, as_json(values), iteration.pk],
        )


def requeue_stalled(stall_s: float) -> list[int]:
    """Queue again every running iteration whose runner died: its latest heartbeat is older than `stall_s` and nobody
    holds its locks (a live runner keeps them; a killed worker's go with its connection). Returns their ids."""
    cutoff = timezone.now().timestamp() - stall_s
    requeued = []
    for iteration in Iteration.objects.filter(status=Iteration.Status.RUNNING):
        entries = [iteration.stages.get(s, {}) for s in iteration.selected_stages]
        if any(e.get("status") == "queued" for e in entries):
            continue  # waiting for a worker of its queue (redelivered by the broker if one took it and died)
        beats = [datetime.fromisoformat(e["heartbeat"]).timestamp() for e in entries if e.get("heartbeat")]
        beats.append((iteration.started_at or iteration.created_at).timestamp())
        if max(beats) > cutoff:
            continue
        keys = [iteration_lock(iteration.pk)] + [stage_lock(iteration.pk, s) for s in iteration.selected_stages]
        if any(_held(key) for key in keys):
            continue
        if iteration.current_stage:  # its heartbeat restarts the clock: one requeue per stall period
            merge_entry(iteration, iteration.current_stage, {"heartbeat": timezone.now().isoformat()})
        log.warning("iteration %s stalled (no heartbeat for %.0f s): queued again", iteration.pk, stall_s)
        current_app.send_task(RUN_TASK, args=[iteration.pk])
        requeued.append(iteration.pk)
    return requeued


def _held(key: str) -> bool:
    """Whether another session holds the advisory lock `key`."""
    with advisory_lock(key) as free:
        return not free


def _finish(iteration: Iteration, status: str, error: str = "") -> Iteration:
    iteration.status, iteration.error, iteration.finished_at = status, error, timezone.now()
    for stage in iteration.stages.values():
        if stage.get("status") in ("running", "queued"):
            stage["status"] = status if status != Iteration.Status.SUCCEEDED else "done"
    iteration.save(update_fields=["status", "error", "finished_at", "stages"])
    push(iteration)
    return iteration


def _run_stage(iteration: Iteration, stage: str, chunk: int) -> None:
    now = timezone.now()
    entry = iteration.stages.setdefault(stage, {"done": 0, "total": None})
    entry.update(status="running", started_at=entry.get("started_at") or now.isoformat(), heartbeat=now.isoformat())
    iteration.current_stage = stage
    fields = ["stages", "current_stage"]
    if stage == Stage.VALIDATE and not iteration.scope_until:
        # Fixed when validation first starts (not when the iteration does): an RFT stage's rollouts are in scope.
        iteration.scope_until = now
        fields.append("scope_until")
    iteration.save(update_fields=fields)
    push(iteration)
    started = time.monotonic()
    report = lambda done, total: progress(iteration, stage, done, total)  # noqa: E731
    if stage == Stage.VALIDATE:
        output = validate_and_route(iteration, chunk=chunk)
    elif stage == Stage.EXPORT:
        from .export import export_iteration

        output = export_iteration(iteration, progress=report)
    elif stage == Stage.RFT:
        run_rft = _optional("flywheel.rft", "run_rft")
        if run_rft is None:
            raise IterationError("the RFT stage is not installed (flywheel.rft.run_rft)")
        output = run_rft(iteration, report)
    elif stage in TRAINING_STAGES:
        from .training_stages import run_training_stage

        output = run_training_stage(iteration, stage)
    elif stage == Stage.EVALUATE:
        from .training_stages import run_evaluate_stage

        output = run_evaluate_stage(iteration)
    else:
        raise IterationError(f"unknown stage {stage!r}")
    entry = iteration.stages[stage]
    entry.update(status="done", finished_at=timezone.now().isoformat(), seconds=round(time.monotonic() - started, 3))
    entry["output"] = output
    iteration.save(update_fields=["stages"])
    push(iteration)


# --- scope -----------------------------------------------------------------------------------------------------------


def stored() -> QuerySet[Validation]:
    """Validations whose trajectory reached a store: routed to SFT or CT by an iteration that made a version of that
    store."""
    versions = DatasetVersion.objects.filter(iteration=OuterRef("iteration"), kind=OuterRef("route"))
    return Validation.objects.filter(route__in=[Route.SFT, Route.CT]).filter(Exists(versions))


def scope_queryset(iteration: Iteration) -> QuerySet[Trajectory]:
    """The trajectories an iteration validates: finished ones (not in progress) submitted (or, without a submission
    time, created) before it started, narrowed by mode, task domain and date; with scope "new", only those not yet in
    a store (held ones come back: they may have been repaired)."""
    queryset = Trajectory.objects.exclude(
        status__in=[Trajectory.Status.IN_PROGRESS, Trajectory.Status.ABANDONED]
    ).alias(scope_time=Coalesce("submitted_at", "created_at"))
    if iteration.scope_until:
        queryset = queryset.filter(scope_time__lte=iteration.scope_until)
    if iteration.modes:
        queryset = queryset.filter(mode__in=iteration.modes)
    if iteration.domains:
        queryset = queryset.filter(task__domain__in=iteration.domains)
    if iteration.date_from:
        queryset = queryset.filter(scope_time__gte=iteration.date_from)
    if iteration.date_to:
        queryset = queryset.filter(scope_time__lt=iteration.date_to)
    if iteration.scope == Iteration.Scope.NEW:
        earlier = stored().exclude(iteration=iteration).filter(trajectory=OuterRef("pk"))
        queryset = queryset.filter(~Exists(earlier))
    return queryset.order_by()


# --- validation and routing ----------------------------------------------------------------------------------------


def _latest_review() -> Subquery:
    reviews = Review.objects.filter(trajectory=OuterRef("pk")).order_by("-created_at", "-id")
    return Subquery(reviews.values(json=JSONObject(id="id", verdict="verdict", score="score"))[:1])


def gather(ids_and_rows: list[tuple[Any, ...]]) -> list[Signals]:
    """Signals for a chunk of trajectories (rows from `_trajectory_rows`): one query for all their steps."""
    ids = [row[0] for row in ids_and_rows]
    steps = (
        Step.objects.filter(trajectory_id__in=ids)
        .exclude(status=Step.Status.CUT)  # a reviewer cut them (annotation_app.step_edits): not part of it any more
        .order_by()
        .values("trajectory_id")
        .annotate(
            indices=ArrayAgg("index", order_by="index"),
            actions=ArrayAgg("action_text", order_by="index"),
            no_screenshot=ArrayAgg("index", filter=Q(screenshot=""), order_by="index", default=[]),
            unfinished=ArrayAgg("index", filter=~Q(status=Step.Status.DONE), order_by="index", default=[]),
            with_thought=Count("id", filter=~Q(thought="")),
        )
        .values_list("trajectory_id", "indices", "actions", "no_screenshot", "unfinished", "with_thought")
    )
    by_trajectory = {row[0]: row[1:] for row in steps}
    curation = dict(Trajectory.objects.filter(pk__in=ids).exclude(flags=[]).values_list("pk", "flags"))
    bad_steps = open_bad_verdicts(ids)
    signals = []
    for pk, mode, reward, review, capture_id, flags in ids_and_rows:
        indices, actions, no_screenshot, unfinished, with_thought = by_trajectory.get(pk, ([], [], [], [], 0))
        signals.append(
            Signals(
                trajectory_id=pk,
                mode=mode,
                indices=indices,
                actions=actions,
                no_screenshot=no_screenshot or (),
                unfinished=unfinished or (),
                with_thought=with_thought,
                outcome_reward=reward,
                review=ReviewSignal(review["id"], review["verdict"], review["score"]) if review else None,
                capture_flags=(flags or []) if capture_id is not None else None,
                curation_flags=trajectory_flag_names(curation.get(pk)),
                bad_steps=bad_steps.get(pk, ()),
            )
        )
    return signals


def _trajectory_rows(queryset: QuerySet[Trajectory], after: int, chunk: int) -> list[tuple[Any, ...]]:
    return list(
        queryset.filter(pk__gt=after)
        .annotate(latest_review=_latest_review())
        .order_by("pk")
        .values_list("pk", "mode", "outcome_reward", "latest_review", "capture__id", "capture__flags")[:chunk]
    )


def _fetch(pending: QuerySet[Trajectory], after: int, chunk: int) -> tuple[int, list[Signals]]:
    """The next chunk after id `after`: its last id and its trajectories' signals (two queries)."""
    rows = _trajectory_rows(pending, after, chunk)
    return (rows[-1][0] if rows else after), gather(rows) if rows else []


def _fetch_in_thread(pending: QuerySet[Trajectory], after: int, chunk: int) -> tuple[int, list[Signals]]:
    try:
        return _fetch(pending, after, chunk)
    finally:
        connection.close()  # this thread's own connection


PREFETCH = True  # fetch the next chunk on a second connection (bench/flywheel_validation.py compares both)


def _chunks_of_signals(pending: QuerySet[Trajectory], chunk: int) -> Iterator[list[Signals]]:
    """The signals of `pending`, chunk by chunk (keyset on id). Outside a transaction the next chunk is fetched on a
    second connection while the caller validates and stores this one, so PostgreSQL and Python work at once; inside
    one (a caller's atomic block, the tests' transaction) a second connection could not see the rows, so it fetches
    inline."""
    if connection.in_atomic_block or not PREFETCH:
        after = 0
        while True:
            after, signals = _fetch(pending, after, chunk)
            if not signals:
                return
            yield signals
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-fetch") as pool:
        after, signals = _fetch(pending, 0, chunk)
        while signals:
            upcoming = pool.submit(_fetch_in_thread, pending, after, chunk)
            try:
                yield signals
            except BaseException:
                upcoming.cancel()
                raise
            after, signals = upcoming.result()


def validate_and_route(
    iteration: Iteration, *, chunk: int = CHUNK, on_chunk: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Give every trajectory in scope its Validation for this iteration (V, components, route, reason); resumes
    where an interrupted run stopped. Returns the stage's output: counts by route and the share that reached SFT."""
    config = VConfig.from_dict(iteration.config.get("v"))
    orm = OrmConfig.from_dict(iteration.config.get("orm"))
    scope = scope_queryset(iteration)
    mine = Validation.objects.filter(iteration=iteration)
    total = scope.count()
    pending = scope.filter(~Exists(mine.filter(trajectory=OuterRef("pk"))))
    done = mine.count()
    report = on_chunk or (lambda d, t: progress(iteration, Stage.VALIDATE, d, t))
    report(done, total)
    for signals in _chunks_of_signals(pending, chunk):
        attach_orm_scores(signals, orm)  # the generative ORM, where enabled: fills Signals.orm and orm_source
        verdicts = [(s.trajectory_id, validate(s, config)) for s in signals]
        insert_validations(iteration.pk, verdicts)
        done += len(verdicts)
        report(done, total)
    return routing_summary(iteration)


def insert_validations(iteration_id: int, verdicts: list[tuple[int, Verdict]]) -> None:
    """Store a chunk's validations: COPY into a session-local temporary table, then one INSERT … SELECT that ignores
    the rows this iteration already has (a resumed or repeated run). Django's bulk_create spent 0.5 ms a row here (a
    bound parameter per field and row, rendered client-side), most of the stage's time; this is ~0.15 ms."""
    if not verdicts:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        # Losing the last chunk to a crash is harmless (the stage redoes it), so don't wait for the WAL flush.
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS flywheel_validation_in (trajectory_id bigint, v float8, components jsonb,"
            " route text, reason text, threshold float8) ON COMMIT DELETE ROWS"
        )
        # Emptied here too: inside a caller's transaction nothing commits between chunks.
        cursor.execute("TRUNCATE flywheel_validation_in")
        with cursor.copy("COPY flywheel_validation_in FROM STDIN") as copy:
            for pk, verdict in verdicts:
                copy.write_row(
                    (pk, verdict.v, json.dumps(verdict.components), verdict.route, verdict.reason, verdict.threshold)
                )
        cursor.execute(
            f"INSERT INTO {Validation._meta.db_table}"
            " (iteration_id, trajectory_id, v, components, route, reason, threshold, created_at)"
            " SELECT %s, trajectory_id, v, components, route, reason, threshold, now() FROM flywheel_validation_in"
            " ON CONFLICT (iteration_id, trajectory_id) DO NOTHING",
            [iteration_id],
        )


def routing_summary(iteration: Iteration) -> dict[str, Any]:
    """Counts by route and the seed's headline ratio: the share of validated trajectories that reached SFT."""
    counts = dict(
        Validation.objects.filter(iteration=iteration).order_by().values_list("route").annotate(n=Count("id"))
    )
    validated = sum(counts.values())
    by_route = {route: counts.get(route, 0) for route in Route.values}
    summary: dict[str, Any] = {
        "validated": validated,
        "routes": by_route,
        "sft_share": round(by_route[Route.SFT] / validated, 4) if validated else None,
    }
    if (iteration.config.get("orm") or {}).get("enabled"):
        judged = Validation.objects.filter(iteration=iteration, components__has_key="orm")
        summary["orm"] = judged.aggregate(
            asked=Count("id"), unscored=Count("id", filter=Q(components__orm__value=None))
        )
    return summary


def route_counts_by(iteration: Iteration, field: str) -> dict[str, dict[str, int]]:
    """{value of `field` (e.g. trajectory__mode): {route: n}} for an iteration's validations."""
    out: dict[str, dict[str, int]] = {}
    rows = Validation.objects.filter(iteration=iteration).order_by().values_list(field, "route").annotate(n=Count("id"))
    for value, route, n in rows:
        out.setdefault(str(value or "—"), {})[route] = n
    return out
