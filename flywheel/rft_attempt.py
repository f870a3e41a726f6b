"""One rejection-sampling attempt: the base model plays one task once in a leased sandbox, through the trainer's own
rollout code (training.envs.SandboxEnv, training.rollout.RemotePolicy and run_episode), and the attempt is stored as
it happens: a Trajectory(mode=rollout, no annotator) with a Step per model turn (action in screen pixels, the
screenshot the model saw in storage), scored by the task's evaluator (annotation_app.evaluation), then submitted.

Frames: the model sees the sandbox's model-size screenshots and answers in that frame; each step is converted to
screen pixels by sandbox.coordinates when it is stored, as the live path does. The lease is released on every path
(SandboxEnv.close in a finally); an attempt stopped or broken half-way is marked abandoned, so a rerun redoes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import connection
from django.utils import timezone

from annotation_app.evaluation import evaluate_trajectory
from annotation_app.live.sessions import release_quietly, sandbox_as
from annotation_app.models import Step, Task, Trajectory
from sandbox.action_regex import proposal_regex
from sandbox.actions import TERMINAL_ACTIONS, Action, ActionSyntaxError, action_to_dict, format_actions, parse_step
from sandbox.client import NoCapacityError, SandboxClient, SandboxError, SessionGoneError, StepResult
from sandbox.coordinates import ScreenMapping, map_points, mapping_for
from sandbox.outline import to_json as outline_json
from training.envs import Feedback, SandboxEnv
from training.rollout import RemotePolicy, Reply, SamplingParams, run_episode

from .models import ModelVersion

log = logging.getLogger(__name__)

ORIGIN = "rft"  # Trajectory.metadata["origin"] of rollouts: made by the model alone, no human annotator
POLL_S = 1.0  # how often an attempt waiting for sandbox capacity looks again


class Stopped(Exception):
    """The run was cancelled or interrupted: the attempt stops before its next model turn."""


@dataclass(frozen=True)
class RolloutSettings:
    """How every attempt of a run plays (from the iteration's config["rft"], flywheel.rft.check_rft_config)."""

    max_steps: int
    temperature: float
    max_tokens: int
    constrain: bool  # grammar-constrained decoding (structured_outputs), as live proposals use
    keep_images: int  # screenshots sent to the model: the last N, as UI-TARS-1.5 was trained
    lease_ttl_s: float
    capacity_wait_s: float  # how long an attempt waits for a free sandbox before it counts as an error
    seed: int | None = None  # seeds each request (request_seed); None: unseeded


@dataclass(frozen=True)
class AttemptSpec:
    iteration_id: int
    task_id: int
    attempt: int  # 0-based: (iteration, task, attempt) names an attempt across reruns
    model_id: int


@dataclass
class AttemptResult:
    spec: AttemptSpec
    trajectory_id: int | None = None
    reward: float | None = None
    steps: int = 0
    error: str = ""
    stopped: bool = False


class CapacityGate:
    """Attempts beyond the sandbox service's free capacity wait here until a sibling releases its session (or
    another caller frees one), so the run's concurrency settles at what the service can give, at least 1."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._released = 0

    def allocate(self, allocate: Callable[[], dict[str, Any]], stop: threading.Event) -> dict[str, Any]:
        """`allocate()` once a session is free; NoCapacityError after `wait_s`, Stopped when the run stops."""
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._cond:
                seen = self._released
            if stop.is_set():
                raise Stopped
            try:
                return allocate()
            except NoCapacityError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
            with self._cond:
                self._cond.wait_for(lambda seen=seen: self._released != seen, timeout=min(left, POLL_S))

    def released(self) -> None:
        with self._cond:
            self._released += 1
            self._cond.notify_all()


class SessionShelf:
    """Browser sessions a run keeps between its attempts, all leased by one `owner`: an attempt that ends leaves its
    session here and the next browser attempt resets it (`SandboxClient.reset`: a blank page, site data cleared)
    instead of starting a Chromium; the run releases what is left when it ends (`drain`). A crashed run's shelved
    sessions expire with their lease."""

    def __init__(self, owner: str, keep: bool = True) -> None:
        self.owner, self.keep = owner, keep  # keep=False: only counts (every attempt leases and releases its own)
        self._lock = threading.Lock()
        self._kept: list[tuple[str, dict[str, Any]]] = []
        self.leased = 0  # sessions allocated for the run's browser attempts (the others reused one)
        self.attempts = 0  # browser attempts that took a session

    def count(self, *, leased: bool) -> None:
        """One browser attempt took a session: a new one (`leased`) or one handed on (from worker threads)."""
        with self._lock:
            self.attempts += 1
            self.leased += leased

    def put(self, session_id: str, info: dict[str, Any]) -> None:
        with self._lock:
            self._kept.append((session_id, info))

    def take(self) -> tuple[str, dict[str, Any]] | None:
        with self._lock:
            return self._kept.pop() if self._kept else None

    def drain(self) -> None:
        """Release every kept session (quietly: one already gone is what we wanted)."""
        with self._lock:
            kept, self._kept = self._kept, []
        if kept:
            client = sandbox_as(self.owner)
            try:
                for session_id, _info in kept:
                    release_quietly(client, session_id)
            finally:
                client.close()


class RecordingClient:
    """The sandbox client as SandboxEnv uses it, for one attempt: allocation waits for capacity and records the
    session's frame on the trajectory; setup and steps keep how long their screen took to settle; `evaluate` scores
    through annotation_app.evaluation (the record the live path keeps); release never raises."""

    def __init__(self, client: SandboxClient, trajectory: Trajectory, kind: str, gate: CapacityGate,
                 stop: threading.Event, shelf: SessionShelf | None = None) -> None:  # fmt: skip
        self.client, self.trajectory, self.kind = client, trajectory, kind
        self.gate, self.stop = gate, stop
        self.shelf = shelf if kind == "browser" else None  # a desktop is never handed on
        self.info: dict[str, Any] = {}
        self.settle: dict[str, Any] = {}
        self.evaluated = False
        self.lost = False  # the session died under the attempt: it is not handed on
        self.last_outline: list[Any] | None = None

    @property
    def mapping(self) -> ScreenMapping:
        info = self.info
        return mapping_for(info["screen_width"], info["screen_height"], info["model_width"], info["model_height"])

    def allocate(self, ttl_s: float = 300, kind: str = "desktop") -> dict[str, Any]:
        kept = None

        def take_or_lease() -> dict[str, Any]:
            nonlocal kept
            kept = self._kept(ttl_s)
            return kept or self.client.allocate(ttl_s=ttl_s, kind=self.kind)

        info = self.gate.allocate(take_or_lease, self.stop)
        if self.shelf is not None:
            self.shelf.count(leased=kept is None)
        try:
            self.info = info
            trajectory = self.trajectory
            trajectory.screen_width, trajectory.screen_height = info["screen_width"], info["screen_height"]
            rft = {**trajectory.metadata.get("rft", {}), "session": info["session_id"], "owner": self.client.owner}
            size = [info["model_width"], info["model_height"]]
            trajectory.metadata = {**trajectory.metadata, "rft": rft, "model_size": size, "kind": self.kind}
            trajectory.save(update_fields=["screen_width", "screen_height", "metadata", "updated_at"])
        except BaseException:
            self.release(info["session_id"])
            raise
        return info

    def _kept(self, ttl_s: float) -> dict[str, Any] | None:
        """A shelved browser session made fresh for this attempt, if there is one that can be reset."""
        while self.shelf is not None and self.shelf.keep and (kept := self.shelf.take()) is not None:
            session_id, info = kept
            try:
                self.client.reset(session_id, ttl_s)
                return info
            except SandboxError as exc:  # expired or broken meanwhile (a failed reset is reclaimed): try the next
                log.info("reset of kept sandbox session %s: %s", session_id, exc)
                release_quietly(self.client, session_id)
        return None

    def setup(self, session_id: str, config: list[dict[str, Any]]) -> list[str]:
        done, settled = self.client.setup_settled(session_id, config)
        self.settle = settled or {}
        return done

    def observe(self, session_id: str, **kwargs: Any) -> bytes:
        return self.client.observe(session_id, **kwargs)

    def outline(self, session_id: str) -> list[Any]:
        """A browser page's interactive elements: SandboxEnv puts them in each observation (sandbox/outline.py);
        the last ones read are kept for the step taken on that observation (RolloutEnv clears them before each)."""
        elements = self.client.outline(session_id)
        self.last_outline = outline_json(elements)
        return elements

    def step(self, session_id: str, action_text: str, **kwargs: Any) -> StepResult:
        result = self.client.step(session_id, action_text, **kwargs)
        self.settle = result.settle or {}
        return result

    def evaluate(self, session_id: str, evaluator: dict[str, Any], *, last_action: str | None = None) -> float:
        """The task's evaluator, recorded on the trajectory; an evaluator that could not run raises (SandboxEnv
        then scores 0 and keeps the error), its outcome_reward stays empty with the reason in metadata."""
        self.evaluated = True
        record = evaluate_trajectory(self.client, session_id, self.trajectory, last_action)
        if record.get("status") != "scored":
            raise SandboxError("evaluator", 500, str(record.get("message", "no score")))
        return float(record["score"])

    def keep(self, session_id: str, ttl_s: float) -> None:
        """Renew the lease before a model turn (turns wait for a shared policy server); a failure is left to the
        next sandbox call to report."""
        try:
            self.client.renew(session_id, ttl_s)
        except SandboxError as exc:
            log.info("renewing sandbox session %s: %s", session_id, exc)

    def release(self, session_id: str) -> None:
        """Give the session back, or shelve it for the run's next browser attempt (one that died is let go)."""
        try:
            shelve = self.shelf is not None and self.shelf.keep and not self.lost
            if shelve and session_id == self.info.get("session_id"):
                self.shelf.put(session_id, self.info)
            else:
                release_quietly(self.client, session_id)
        finally:
            self.gate.released()


@dataclass
class StepRecorder:
    """Stores each model turn of an attempt as a Step, in screen pixels, with the screenshot the model saw."""

    trajectory: Trajectory
    client: RecordingClient
    model_id: int
    index: int = 0
    truncated: bool = False
    turn_started: datetime | None = None
    latency_ms: int | None = None
    problems: list[str] = field(default_factory=list)

    def record(
        self, reply: str, feedback: Feedback, before: bytes, settle: dict[str, Any], outline: list[Any] | None = None
    ) -> None:
        info = feedback.info
        reply = reply.replace("\x00", "\ufffd")  # PostgreSQL's text and jsonb refuse NUL, which free decoding can write
        if info.get("truncated") and "session_lost" not in info:  # out of steps: SandboxEnv did not run this reply
            self.truncated = True
            return
        status, error = Step.Status.DONE, ""
        try:
            parsed = parse_step(reply)  # as SandboxEnv parsed it
        except ActionSyntaxError:  # stored as written: validation holds the trajectory back with the parser's words
            thought, _, action = reply.partition("Action:")
            text, actions, thought = action.strip() or reply.strip(), [], thought.replace("Thought:", "").strip()
            self.problems.append(f"step {self.index}: {info.get('error', 'does not parse')}")
        else:
            end = next((n for n, a in enumerate(parsed.actions) if a.name in TERMINAL_ACTIONS), None)
            ran = parsed.actions if end is None else parsed.actions[: end + 1]
            text, actions, thought = *self._on_screen(ran), parsed.thought
            if "error" in info:  # parsed, but the sandbox refused it: nothing (or not all of it) ran
                status, error = Step.Status.FAILED, f"the sandbox refused the action: {info['error']}"
                self.problems.append(f"step {self.index}: {error}")
        if "session_lost" in info:  # sent, but the desktop died: its result is unknown
            status, error = Step.Status.FAILED, f"the sandbox session was lost: {info['session_lost']}"
            self.problems.append(f"step {self.index}: {error}")
        now = timezone.now()
        step = Step(
            trajectory=self.trajectory, index=self.index, thought=thought, action_text=text,
            action={"actions": actions}, source=Step.Source.MODEL, status=status, error=error,
            model_version_id=self.model_id, screenshot_sha256=hashlib.sha256(before).hexdigest(),
            started_at=self.turn_started, finished_at=now, model_latency_ms=self.latency_ms, settle=settle,
            outline=outline,
        )  # fmt: skip
        step.screenshot.save("step.jpg", ContentFile(before), save=False)
        step.save()
        self.index += 1

    def _on_screen(self, actions: list[Action]) -> tuple[str, list[dict[str, Any]]]:
        """Model-frame actions as the canonical text and typed dicts in screen pixels (sandbox.coordinates)."""
        moved = map_points(actions, self.client.mapping.to_screen)
        return format_actions(moved), [action_to_dict(a) for a in moved]


class RolloutEnv(SandboxEnv):
    """SandboxEnv whose every step is stored by `recorder` as it happens (with the screen before it)."""

    def __init__(self, client: RecordingClient, task: dict[str, Any], image_dir: Path, *, recorder: StepRecorder,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(client, task, image_dir, **kwargs)
        self.recorder = recorder
        self.screen_jpeg = b""
        self.screen_settle: dict[str, Any] = {}
        self.screen_outline: list[Any] | None = None  # the page's elements read with the screenshot (browser)
        self.lost = ""  # why the session was lost mid-attempt, if it was

    def _observation(self, jpeg: bytes) -> dict[str, Any]:
        self.screen_jpeg, self.screen_settle = jpeg, dict(self.client.settle)
        self.client.last_outline = None
        message = super()._observation(jpeg)
        self.screen_outline = self.client.last_outline
        return message

    def step(self, reply: str) -> Feedback:
        before, settle, outline = self.screen_jpeg, self.screen_settle, self.screen_outline
        try:
            feedback = super().step(reply)
        except SessionGoneError as exc:  # the desktop died (an action may have ended it): the attempt ends here
            self.lost = exc.detail
            self.client.lost = True
            feedback = Feedback(None, 0.0, True, {"steps": self._steps, "session_lost": exc.detail})
        self.recorder.record(reply, feedback, before, settle, outline)
        return feedback


def recent_images(messages: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """The conversation without the screenshot messages older than the last `keep` (their turns' text stays)."""
    shots = [n for n, m in enumerate(messages) if m["role"] == "user" and not isinstance(m["content"], str)]
    drop = set(shots[: max(0, len(shots) - keep)])
    return [m for n, m in enumerate(messages) if n not in drop]


class _Constrained:
    """A PolicyClient whose requests carry the action grammar (structured_outputs), so every reply parses."""

    def __init__(self, client: Any, regex: str) -> None:
        self.client, self.regex = client, regex

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.complete({**body, "structured_outputs": {"regex": self.regex}})

    def close(self) -> None:
        self.client.close()


def request_seed(seed: int, task: Task, attempt: int, turn: int) -> int:
    """The sampling seed of one model request: from the run's seed, the task's content (not its row id, so the
    same task imported again draws the same), the attempt and the turn; attempts of a task differ from each other."""
    content = json.dumps([task.instruction, task.setup_config], sort_keys=True)
    return zlib.crc32(f"{seed}:{attempt}:{turn}:{content}".encode()) & 0x7FFFFFFF


def task_spec(task: Task) -> dict[str, Any]:
    """The task as SandboxEnv reads it (OSWorld's shape)."""
    return {"id": f"task{task.pk}", "instruction": task.instruction, "config": task.setup_config,
            "evaluator": task.evaluator, "platform": task.platform}  # fmt: skip


def run_attempt(spec: AttemptSpec, run: RolloutSettings, gate: CapacityGate, stop: threading.Event,
                shelf: SessionShelf | None = None) -> AttemptResult:  # fmt: skip
    """Play and store one attempt (in a worker thread); errors are returned, never raised. With `shelf`, a browser
    attempt takes a session the run keeps (reset for it) and leaves its own there."""
    result = AttemptResult(spec)
    try:
        _play(spec, run, gate, stop, result, shelf)
    except Stopped:
        result.stopped = True
        result.error = "stopped"
    except Exception as exc:
        log.warning("RFT attempt %s failed", spec, exc_info=True)
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()  # this thread's own database connection
    return result


def _play(spec: AttemptSpec, run: RolloutSettings, gate: CapacityGate, stop: threading.Event,
          result: AttemptResult, shelf: SessionShelf | None) -> None:  # fmt: skip
    task = Task.objects.get(pk=spec.task_id)
    model = ModelVersion.objects.get(pk=spec.model_id)
    trajectory = Trajectory.objects.create(
        task=task, annotator=None, mode=Trajectory.Mode.ROLLOUT, status=Trajectory.Status.IN_PROGRESS,
        model_version=model,
        metadata={"origin": ORIGIN, "rft": {"iteration": spec.iteration_id, "attempt": spec.attempt,
                                            "model": model.name}},
    )  # fmt: skip
    result.trajectory_id = trajectory.pk
    kind = "browser" if task.platform == Task.Platform.BROWSER else "desktop"
    shared = shelf is not None and shelf.keep and kind == "browser"  # kept sessions are leased by the shelf's owner
    owner = shelf.owner if shared else f"trajectory:{trajectory.pk}"
    client = RecordingClient(sandbox_as(owner), trajectory, kind, gate, stop, shelf)
    sampling = SamplingParams(max_new_tokens=run.max_tokens, temperature=run.temperature)
    policy = RemotePolicy(model.endpoint_url, model.model_name, sampling, api_key=settings.POLICY_API_KEY,
                          timeout_s=settings.POLICY_TIMEOUT_S, record_logprobs=False)  # fmt: skip
    recorder = StepRecorder(trajectory, client, model.pk)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="rft-") as tmp:
            images = Path(tmp) / "images"
            env = RolloutEnv(client, task_spec(task), images, recorder=recorder, max_steps=run.max_steps,
                             ttl_s=run.lease_ttl_s)  # fmt: skip

            def ask(messages: list[dict[str, Any]]) -> tuple[Reply, int]:
                if stop.is_set():
                    raise Stopped
                if env.session is not None:
                    client.keep(env.session, run.lease_ttl_s)
                if run.constrain and not isinstance(policy.client, _Constrained):
                    width, height = client.mapping.model_size
                    policy.client = _Constrained(policy.client, proposal_regex(width, height))  # type: ignore[assignment]
                recorder.turn_started, clock = timezone.now(), time.perf_counter()
                seed = None if run.seed is None else request_seed(run.seed, task, spec.attempt, recorder.index)
                answer = policy.generate_one(recent_images(messages, run.keep_images), base_dir=Path(tmp), seed=seed)
                recorder.latency_ms = round((time.perf_counter() - clock) * 1000)
                return answer

            try:
                episode = run_episode(env, ask, seed=spec.attempt, max_turns=run.max_steps)
                if env.lost:
                    _unscored(trajectory, f"The sandbox session was lost before the evaluator could run: {env.lost}")
                elif not client.evaluated and env.session is not None:  # out of steps: score the state as left
                    evaluate_trajectory(client.client, env.session, trajectory, None)
            finally:
                env.close()
    except BaseException as exc:
        _abandon(trajectory, "cancelled" if isinstance(exc, Stopped) else f"{type(exc).__name__}: {exc}")
        raise
    finally:
        policy.client.close()
    info = episode.meta.get("info") or {}
    rft = {**trajectory.metadata["rft"], "steps": recorder.index, "truncated": recorder.truncated,
           "last_action": info.get("last_action"), "seconds": round(time.monotonic() - started, 3)}  # fmt: skip
    if recorder.problems:
        rft["problems"] = recorder.problems[:5]
    if info.get("evaluator_error"):
        rft["evaluator_error"] = info["evaluator_error"]
    if env.lost:
        rft["session_lost"] = env.lost
    rft.pop("session", None)  # released or shelved
    rft.pop("owner", None)
    trajectory.metadata = {**trajectory.metadata, "rft": rft}
    trajectory.status, trajectory.submitted_at = Trajectory.Status.SUBMITTED, timezone.now()
    trajectory.save(update_fields=["metadata", "status", "submitted_at", "updated_at"])
    result.reward, result.steps = trajectory.outcome_reward, recorder.index


def _unscored(trajectory: Trajectory, message: str) -> None:
    """No outcome: the evaluation record says why (as annotation_app.evaluation records an evaluator that failed)."""
    record = {"at": timezone.now().isoformat(), "last_action": None, "status": "error", "message": message}
    trajectory.metadata = {**trajectory.metadata, "evaluation": record}
    trajectory.outcome_reward = None
    trajectory.save(update_fields=["metadata", "outcome_reward", "updated_at"])


def _abandon(trajectory: Trajectory, why: str) -> None:
    """An attempt that did not finish: abandoned (out of every scope), so a rerun redoes it."""
    try:
        metadata = {**trajectory.metadata, "end_reason": why[:500]}
        Trajectory.objects.filter(pk=trajectory.pk, status=Trajectory.Status.IN_PROGRESS).update(
            status=Trajectory.Status.ABANDONED, metadata=metadata, updated_at=timezone.now()
        )
    except Exception:  # the row stays in progress: the next run settles it
        log.warning("could not mark rollout %s abandoned", trajectory.pk, exc_info=True)
