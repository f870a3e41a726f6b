"""Executability verification (UI-TARS-2 §2.4.1): replay a finished trajectory's actions from its task's setup in a
fresh sandbox session, compare each step's screen with the recorded screenshot by perceptual hash, run the task's
evaluator at the end, store a VerificationRun and set the trajectory's `not_executable` / `divergent_steps` flags.

Steps are in screen pixels (the trajectory's frame); they run with `coordinates="screen"`, scaled when the fresh
session's screen differs. The recorded screenshot of step i is the screen before action i: the replay compares the
screen after the setup with step 0 and the screen after action i with step i+1. Terminal actions (finished, fail,
call_user) do not run; they name the last action for the evaluator.

Judgement: not executable when the sandbox refuses an action, or when the evaluator scores the replay below what the
recording scored (`outcome_reward`, or 1 for a trajectory that ends with finished() and has no score). Divergent:
steps whose distance exceeds the threshold. Infrastructure failures (no capacity, the service unreachable, the
session lost) end the run as `error` and leave the flags alone. The sandbox session is released on every path.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from annotation_app import queues
from annotation_app.live.sessions import sandbox_as
from annotation_app.models import Step, Task, Trajectory
from sandbox.actions import TERMINAL_ACTIONS, Action, ActionSyntaxError, format_actions, parse_actions
from sandbox.client import ActionError, SandboxClient, SandboxError
from sandbox.coordinates import map_points

from . import hashing
from .flags import DIVERGENT_STEPS, NOT_EXECUTABLE, REPLAY_KINDS, replace_flags
from .models import VerificationRun

log = logging.getLogger(__name__)

VERIFY_TASK = "sandbox.curation_verify"  # annotation_app.curation.tasks; `sandbox.*` routes to the sandbox queue
DIVERGENCE_BITS = 10  # pHash bits (of 64) beyond which a replayed screen differs from the recorded one
LEASE_TTL_S = 900.0
MAX_BATCH = 200
FINISHED_STATUSES = (Trajectory.Status.SUBMITTED, Trajectory.Status.APPROVED, Trajectory.Status.REJECTED)


class Refused(ValueError):
    """A trajectory that cannot be verified (in words, for the page)."""


def threshold() -> int:
    return int(getattr(settings, "CURATION_DIVERGENCE_BITS", DIVERGENCE_BITS))


def check_verifiable(trajectory: Trajectory) -> None:
    """Refused unless the trajectory is finished, has steps, and (in-situ) its task has a setup to replay from."""
    if trajectory.status not in FINISHED_STATUSES:
        raise Refused(f"Trajectory {trajectory.pk} is {trajectory.get_status_display().lower()}: only finished ones.")
    if trajectory.mode == Trajectory.Mode.IN_SITU and not trajectory.task.setup_config:
        raise Refused(f"Trajectory {trajectory.pk} is an in-situ capture whose task has no setup to replay from.")
    if trajectory.task.platform == Task.Platform.MOBILE:
        raise Refused(f"Trajectory {trajectory.pk} is a mobile task: the sandbox has no phones.")
    if not trajectory.steps.exclude(status=Step.Status.CUT).exists():
        raise Refused(f"Trajectory {trajectory.pk} has no steps to replay.")


def start_verification(
    trajectory_ids: list[int], user: Any = None, *, enqueue: bool = True
) -> tuple[list[VerificationRun], list[str]]:
    """A queued run for each trajectory, sent to the sandbox queue once committed (unless `enqueue` is False: the
    caller runs it); the runs and, per refused trajectory, why."""
    if len(trajectory_ids) > MAX_BATCH:
        raise Refused(f"At most {MAX_BATCH} trajectories at once ({len(trajectory_ids)} given).")
    found = {t.pk: t for t in Trajectory.objects.select_related("task").filter(pk__in=trajectory_ids)}
    settle_stale(trajectory_ids)
    runs: list[VerificationRun] = []
    problems: list[str] = []
    for pk in dict.fromkeys(trajectory_ids):
        trajectory = found.get(pk)
        if trajectory is None:
            problems.append(f"Trajectory {pk} does not exist.")
            continue
        try:
            check_verifiable(trajectory)
            with transaction.atomic():
                run = VerificationRun.objects.create(trajectory=trajectory, requested_by=user, threshold=threshold())
        except Refused as exc:
            problems.append(str(exc))
            continue
        except IntegrityError:  # one_active_verification
            problems.append(f"Trajectory {pk} is already being verified.")
            continue
        if enqueue:
            transaction.on_commit(lambda pk=run.pk: queues.enqueue(VERIFY_TASK, pk))
        runs.append(run)
    return runs, problems


def settle_stale(trajectory_ids: list[int]) -> int:
    """Runs still queued or running long after their lease would have expired (their worker died and the message
    was lost) end as errors, so the trajectory can be verified again; how many."""
    ttl = float(getattr(settings, "CURATION_LEASE_TTL_S", LEASE_TTL_S))
    now = timezone.now()
    stale = VerificationRun.objects.filter(
        trajectory_id__in=trajectory_ids,
        status__in=VerificationRun.ACTIVE,
        created_at__lt=now - timedelta(seconds=2 * ttl),
    )
    why = ["The run never finished (its worker stopped)."]
    return stale.update(status=VerificationRun.Status.ERROR, errors=why, finished_at=now)


@dataclass
class Replay:
    """What a replay found, before it is stored."""

    distances: list[dict[str, Any]] = field(default_factory=list)
    divergent: list[int] = field(default_factory=list)
    refused: str = ""  # the sandbox refused an action: not executable
    score: float | None = None
    expected: float | None = None
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    infrastructure: str = ""  # the replay could not be judged


def run_verification(run_id: int) -> VerificationRun:
    """Claim a queued run, replay it and store the result (idempotent: a finished run is returned as it is)."""
    claimed = VerificationRun.objects.filter(pk=run_id, status__in=VerificationRun.ACTIVE).update(
        status=VerificationRun.Status.RUNNING, started_at=timezone.now()
    )
    run = VerificationRun.objects.select_related("trajectory__task").get(pk=run_id)
    if not claimed:
        return run
    result = Replay()
    client = sandbox_as(f"curation:{run.pk}")
    started = time.perf_counter()
    try:
        _replay(run, client, result)
    except Exception as exc:  # anything unexpected is the run's error, never a stuck 'running' row
        log.warning("verification %s failed", run.pk, exc_info=True)
        result.infrastructure = result.infrastructure or f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    result.timings["total_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return _store(run, result)


def _replay(run: VerificationRun, client: SandboxClient, result: Replay) -> None:
    trajectory = run.trajectory
    task = trajectory.task
    steps = list(trajectory.steps.exclude(status=Step.Status.CUT).order_by("index"))
    kind = _kind(trajectory)
    clock = time.perf_counter()
    try:
        info = client.allocate(ttl_s=float(getattr(settings, "CURATION_LEASE_TTL_S", LEASE_TTL_S)), kind=kind)
    except SandboxError as exc:
        result.infrastructure = f"No sandbox session: {exc.detail}"
        return
    session = info["session_id"]
    VerificationRun.objects.filter(pk=run.pk).update(session_id=session)
    run.session_id = session
    result.timings["allocate_ms"] = _ms(clock)
    try:
        clock = time.perf_counter()
        client.setup_settled(session, task.setup_config or [])
        result.timings["setup_ms"] = _ms(clock)
        screen = client.observe(session)
        scale = _scale(trajectory, info)
        last_action: str | None = None
        clock = time.perf_counter()
        for step in steps:
            _compare(step, screen, run.threshold, result)
            try:
                actions = parse_actions(step.action_text)
            except ActionSyntaxError as exc:
                result.refused = f"step {step.index}'s action does not parse ({exc})"
                break
            if actions:
                last_action = actions[-1].name
            runnable = [a for a in actions if a.name not in TERMINAL_ACTIONS]
            if not runnable:
                continue
            try:
                done = client.step(session, format_actions(_scaled(runnable, scale)), coordinates="screen")
            except ActionError as exc:
                result.refused = f"the sandbox refused step {step.index}'s action: {exc.detail}"
                break
            screen = done.observation_jpeg or client.observe(session)
        result.timings["steps_ms"] = _ms(clock)
        if result.refused:
            return
        result.expected = _expected(trajectory, last_action)
        if task.evaluator:
            clock = time.perf_counter()
            try:
                result.score = float(client.evaluate(session, task.evaluator, last_action=last_action))
            except SandboxError as exc:
                result.errors.append(f"The evaluator could not run: {exc.detail}")
            result.timings["evaluate_ms"] = _ms(clock)
    except SandboxError as exc:
        result.infrastructure = f"The sandbox failed during the replay: {exc.detail}"
    finally:
        try:
            client.release(session)
        except SandboxError as exc:  # already gone (expired, lost): the state we wanted
            log.info("release of sandbox session %s: %s", session, exc)


def _compare(step: Step, screen: bytes, bits: int, result: Replay) -> None:
    """The distance of the replayed screen to the step's recorded screenshot, kept on `result`."""
    distance: int | None = None
    if not step.screenshot:
        result.errors.append(f"Step {step.index} has no recorded screenshot.")
    else:
        try:
            with step.screenshot.open("rb") as f:
                recorded = hashing.phash(f.read())
            distance = hashing.distance(recorded, hashing.phash(screen))
        except (OSError, ValueError) as exc:
            result.errors.append(f"Step {step.index}'s screenshot could not be compared: {exc}")
    result.distances.append({"index": step.index, "distance": distance})
    if distance is not None and distance > bits:
        result.divergent.append(step.index)


def _kind(trajectory: Trajectory) -> str:
    """The sandbox kind the trajectory was made in: its live session's, the rollout's, else the task's platform."""
    live = getattr(trajectory, "live", None)  # RelatedObjectDoesNotExist is an AttributeError
    kind = (live.kind if live is not None else "") or trajectory.metadata.get("kind", "")
    if kind in ("desktop", "browser"):
        return kind
    return "browser" if trajectory.task.platform == Task.Platform.BROWSER else "desktop"


def _scale(trajectory: Trajectory, info: dict[str, Any]) -> tuple[float, float]:
    return (info["screen_width"] / trajectory.screen_width, info["screen_height"] / trajectory.screen_height)


def _scaled(actions: list[Action], scale: tuple[float, float]) -> list[Action]:
    if scale == (1.0, 1.0):
        return actions
    return map_points(actions, lambda x, y: (round(x * scale[0]), round(y * scale[1])))


def _expected(trajectory: Trajectory, last_action: str | None) -> float | None:
    if trajectory.outcome_reward is not None:
        return float(trajectory.outcome_reward)
    return 1.0 if last_action == "finished" else None


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def _store(run: VerificationRun, result: Replay) -> VerificationRun:
    """Save the run's outcome and (unless it could not be judged) replace the trajectory's replay flags."""
    run.distances, run.divergent_steps, run.timings = result.distances, result.divergent, result.timings
    run.evaluator_score, run.expected_score = result.score, result.expected
    run.errors = result.errors + ([result.infrastructure] if result.infrastructure else [])
    run.finished_at = timezone.now()
    if result.infrastructure:
        run.status, run.executable = VerificationRun.Status.ERROR, None
        run.save()
        return run
    flags: list[dict[str, Any]] = []
    lower = result.score is not None and result.expected is not None and result.score < result.expected
    if result.refused or lower:
        why = result.refused or f"the evaluator scored the replay {result.score:g}, the recording {result.expected:g}"
        flags.append({"kind": NOT_EXECUTABLE, "detail": why, "run": run.pk})
    if result.divergent:
        listed = ", ".join(str(i) for i in result.divergent[:10])
        detail = f"step(s) {listed} look different on replay (pHash distance > {run.threshold} bits)"
        flags.append({"kind": DIVERGENT_STEPS, "detail": detail, "steps": result.divergent, "run": run.pk})
    if result.refused:
        run.errors = [result.refused, *run.errors]
    run.executable = not (result.refused or lower)
    run.status = VerificationRun.Status.FLAGGED if flags else VerificationRun.Status.PASSED
    run.save()
    replace_flags(run.trajectory_id, REPLAY_KINDS, flags)
    return run
