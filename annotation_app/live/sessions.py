"""Live interactive annotation (UI-TARS-2 report 2.4.2): the model proposes, the annotator accepts or overrides.

The rules live here, callable from views, the API, Celery tasks and tests alike:
`open_live` → (Celery) `start` leases a sandbox and runs the task setup → `propose` asks the trajectory's model for
candidates → `take_step` runs the chosen or typed action and stores the step → … → `end_live` releases the lease.
Every step is stored when it happens, so a closed tab or a lost connection loses nothing.

Frames: the live session works in the model image's frame (the screenshot the model saw, its proposals and the
annotator's overrides typed on that screenshot); a step is stored in screen pixels (see Step). `frame_of` is the
conversion between the two, done here at the model boundary only: proposals and overrides when a step is stored,
the stored history when it is sent to the model.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from flywheel.models import ModelVersion
from sandbox.actions import ActionSyntaxError, action_to_dict, format_actions, parse_actions
from sandbox.client import ActionError, SandboxClient, SandboxError, SessionGoneError, StepResult
from sandbox.client import connection as sandbox_connection
from sandbox.coordinates import ScreenMapping, map_points, mapping_for
from sandbox.outline import render as render_outline
from sandbox.outline import to_json as outline_json
from training.policy.client import PolicyClient, PolicyError, Proposal, proposal_of
from training.policy.client import connection as policy_connection
from training.policy.prompts import Turn, build_messages

from .. import candidates as shapes
from .. import queues, task_queue
from ..evaluation import evaluate_trajectory
from ..models import Assignment, LiveSession, Step, Task, Trajectory, User
from ..trajectories import Conflict, Invalid, start_trajectory, submit

log = logging.getLogger(__name__)

ENDING_ACTIONS = {"finished": "finished", "call_user": "call_user", "fail": "fail"}  # sandbox.actions.TERMINAL_ACTIONS
# A step still 'executing' this long after it was stored was left by a process that stopped while running it (the
# sandbox client's own timeout is 300 s): its outcome is recorded as unknown.
STALE_EXECUTING_S = 600
FAILED_TAIL = "the step is kept as failed and the session has ended; the steps before it are stored."


def group(trajectory_id: int) -> str:
    return f"live.{trajectory_id}"


def push(trajectory_id: int, event: str, **payload: Any) -> None:
    """Send `{event, ...}` to the open live page of this trajectory (its owner's only). From sync code the send runs
    on this process's lasting channel-layer loop (`layer_loop`), in order, and returns once it is sent."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "live.event", "event": event, **payload}
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: a view, a Celery task, a test
        asyncio.run_coroutine_threadsafe(layer.group_send(group(trajectory_id), message), layer_loop()).result(30)
    else:  # called on a running loop's thread: async_to_sync refuses, as before
        async_to_sync(layer.group_send)(group(trajectory_id), message)


_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def layer_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for channel-layer sends, on a thread of its own. async_to_sync starts a fresh loop
    for every call, and channels_redis then a fresh Redis connection (~35 ms a push, bench/live.py); this loop keeps
    its connections (~0.5 ms). A forked child (gunicorn's workers) starts its own."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid() or _loop[1].is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="channel-layer-loop", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


_after_step = ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-after-step")


def request_proposals_soon(live: LiveSession) -> None:
    """Ask for the next step's proposals off the annotator's path (a Celery publish is ~10-25 ms, with a long tail
    when its connection is renewed); a failure is logged, and the page offers 'retry proposals'."""
    index = live.next_index

    def send() -> None:
        try:
            queues.enqueue(queues.PROPOSE_LIVE, live.pk, index)
        except Exception:
            log.exception("live session %s: the proposals of step %s could not be requested", live.pk, index)

    _after_step.submit(send)


def push_soon(trajectory_id: int, event: str, **payload: Any) -> None:
    """`push` on the after-step thread, so the step's answer (which carries the same state) does not wait for the
    channel layer; it is sent before the proposals request queued after it, in order."""

    def send() -> None:
        try:
            push(trajectory_id, event, **payload)
        except Exception:
            log.exception("live page %s: the %s event could not be pushed", trajectory_id, event)

    _after_step.submit(send)


@functools.cache
def _sandbox_http(base_url: str, api_key: str) -> httpx.Client:
    return sandbox_connection(base_url, api_key, timeout_s=300)


@functools.cache
def _policy_http(base_url: str, api_key: str, timeout_s: float) -> httpx.Client:
    return policy_connection(base_url, api_key, timeout_s)


def sandbox_as(owner: str) -> SandboxClient:
    """The sandbox service, acting for `owner` (over this process's shared connections)."""
    http = _sandbox_http(settings.SANDBOX_URL, settings.SANDBOX_API_KEY)
    return SandboxClient(settings.SANDBOX_URL, settings.SANDBOX_API_KEY, owner, http=http)


def sandbox_for(trajectory_id: int) -> SandboxClient:
    """The sandbox service, as the owner of this trajectory's lease."""
    return sandbox_as(f"trajectory:{trajectory_id}")


def policy_for(model: ModelVersion) -> PolicyClient:
    if not model.endpoint_url:
        raise PolicyError(f"model {model.name!r} has no endpoint URL; register where it is served")
    return PolicyClient(
        model.endpoint_url,
        model.model_name,
        api_key=settings.POLICY_API_KEY,
        timeout_s=settings.POLICY_TIMEOUT_S,
        constrain=settings.POLICY_CONSTRAIN,
        http=_policy_http(model.endpoint_url, settings.POLICY_API_KEY, settings.POLICY_TIMEOUT_S),
    )


# --- opening and resuming --------------------------------------------------------------------------------------------


def open_live(annotator: User, task: Task, *, seed: int | None = None) -> LiveSession:
    """The open live session of this annotator on this task, or a new one (its desktop starts in a Celery task);
    `seed` makes a new session's sampled proposals reproducible (`step_seed`)."""
    existing = (
        LiveSession.objects.select_related("trajectory")
        .filter(trajectory__annotator=annotator, trajectory__task=task, status__in=["starting", "active"])
        .order_by("-created_at")
        .first()
    )
    if existing is not None and lease_alive(existing):
        return existing
    model = ModelVersion.objects.filter(is_active=True).first()
    if model is None:
        raise Conflict("No annotation model is active yet: an ML engineer has to promote one first.")
    kind = "browser" if task.platform == Task.Platform.BROWSER else "desktop"
    with transaction.atomic():
        trajectory = start_trajectory(
            annotator, task, Trajectory.Mode.INTERACTIVE, model_version=model, simulated=annotator.is_simulated
        )
        live = LiveSession.objects.create(trajectory=trajectory, kind=kind, proposal_seed=seed)

    transaction.on_commit(lambda: queues.enqueue(queues.START_LIVE, live.pk))
    return live


def next_task(annotator: User, *, skip_current: bool = False) -> Assignment:
    """The queue's next task (task_queue.next_task); a skip first ends the live session open on the skipped task, so
    its desktop is released and its trajectory marked abandoned instead of holding a lease nobody uses."""
    if skip_current and (current := task_queue.current_assignment(annotator)) is not None:
        open_sessions = LiveSession.objects.filter(
            trajectory__annotator=annotator, trajectory__task_id=current.task_id,
            status__in=[LiveSession.Status.STARTING, LiveSession.Status.ACTIVE],
        )  # fmt: skip
        for session in open_sessions:
            end_live(session, "skipped")
    return task_queue.next_task(annotator, skip_current=skip_current)


def lease_alive(live: LiveSession) -> bool:
    """Renew the lease of an open session; a lease that is gone ends the session (its steps stay stored)."""
    if live.status == LiveSession.Status.STARTING:
        return True
    if live.status != LiveSession.Status.ACTIVE:
        return False
    try:
        renew(live)
    except SessionGoneError:
        end_live(live, "lease_lost", release=False)
        return False
    except SandboxError as exc:  # the service is down for now: the lease may well outlive the outage
        log.warning("could not renew the lease of live session %s: %s", live.pk, exc)
    return True


def renew(live: LiveSession) -> None:
    client = sandbox_for(live.trajectory_id)
    try:
        client.renew(live.sandbox_session_id, settings.LIVE_LEASE_TTL_S)
    finally:
        client.close()
    expires = timezone.now() + timedelta(seconds=settings.LIVE_LEASE_TTL_S)
    LiveSession.objects.filter(pk=live.pk).update(lease_expires_at=expires)


def start(live_id: int) -> None:
    """Lease the sandbox, run the task's setup, take the first screenshot, then ask for proposals (Celery)."""
    live = LiveSession.objects.select_related("trajectory__task").filter(pk=live_id).first()
    if live is None or live.status != LiveSession.Status.STARTING:
        return  # a retried delivery of a session that already started
    trajectory = live.trajectory
    client = sandbox_for(trajectory.pk)
    try:
        info = client.allocate(ttl_s=settings.LIVE_LEASE_TTL_S, kind=live.kind)
        live.sandbox_session_id = info["session_id"]
        live.save(update_fields=["sandbox_session_id", "updated_at"])
        settled = None
        if trajectory.task.setup_config:
            _done, settled = client.setup_settled(live.sandbox_session_id, trajectory.task.setup_config)
        jpeg = client.observe(live.sandbox_session_id)
    except SandboxError as exc:
        if live.sandbox_session_id:
            release_quietly(client, live.sandbox_session_id)
        fail(live, f"The sandbox could not be prepared: {exc.detail}")
        return
    finally:
        client.close()
    live.model_width, live.model_height = info["model_width"], info["model_height"]
    live.observation.save(f"obs-{0:05d}.jpg", ContentFile(jpeg), save=False)
    live.observation_settle = settled or {}
    live.status = LiveSession.Status.ACTIVE
    live.proposals = LiveSession.Proposals.PENDING
    live.lease_expires_at = timezone.now() + timedelta(seconds=settings.LIVE_LEASE_TTL_S)
    live.save()
    Trajectory.objects.filter(pk=trajectory.pk).update(
        screen_width=info["screen_width"],
        screen_height=info["screen_height"],
        metadata={**trajectory.metadata, "model_size": [live.model_width, live.model_height], "kind": live.kind},
    )
    push(trajectory.pk, "state", state=state_of(live))
    propose(live.pk, 0)


def fail(live: LiveSession, message: str) -> None:
    live.status, live.error, live.ended_at = LiveSession.Status.FAILED, message, timezone.now()
    live.save(update_fields=["status", "error", "ended_at", "updated_at"])
    push(live.trajectory_id, "state", state=state_of(live))


# --- proposals -------------------------------------------------------------------------------------------------------


def frame_of(live: LiveSession) -> ScreenMapping:
    """Model frame <-> screen pixels for this session: the frame the sandbox sized its screenshots for."""
    trajectory = live.trajectory
    return mapping_for(trajectory.screen_width, trajectory.screen_height, live.model_width, live.model_height)


def in_frame(action_text: str, convert: Any) -> tuple[str, list[dict[str, Any]]]:
    """Parsed `action_text` with every point passed through `convert`: (canonical text, typed actions)."""
    actions = map_points(parse_actions(action_text), convert)
    return format_actions(actions), [action_to_dict(a) for a in actions]


def history_of(trajectory: Trajectory, keep_images: int, mapping: ScreenMapping) -> list[Turn]:
    """The steps so far as the model reads them: stored screen pixels converted to its frame through `mapping`."""
    steps = list(trajectory.steps.filter(status=Step.Status.DONE).order_by("index"))
    turns = []
    for n, step in enumerate(steps):
        image = None
        if n >= len(steps) - (keep_images - 1) and step.screenshot:
            with step.screenshot.open("rb") as f:
                image = f.read()
        turns.append(Turn(image, step.thought, in_frame(step.action_text, mapping.to_model)[0]))
    return turns


def page_outline(live: LiveSession) -> tuple[str | None, list[dict[str, Any]] | None]:
    """A browser session's outline of interactive elements: the prompt text in the model's frame, as the trainer's
    SandboxEnv gives it with each browser observation (sandbox/outline.py), so a model trained on it is prompted the
    same way here; and the elements in screen pixels, stored with the step. (None, None) for a desktop session."""
    if live.kind != "browser" or not settings.LIVE_OUTLINE:
        return None, None
    try:
        elements = sandbox_for(live.trajectory_id).outline(live.sandbox_session_id)
    except (SandboxError, ValueError, httpx.HTTPError):
        return "Interactive elements: unavailable.", None
    return render_outline(elements, frame_of(live).scale), outline_json(elements)


def step_seed(seed: int | None, index: int) -> int | None:
    """The sampling seed of step `index`'s proposals in a session seeded with `seed` (None: unseeded)."""
    return None if seed is None else zlib.crc32(f"{seed}:{index}".encode()) & 0x7FFFFFFF


def propose(live_id: int, index: int) -> None:
    """Ask the trajectory's model for candidates for step `index` and push them; stale requests do nothing."""
    related = LiveSession.objects.select_related("trajectory__task", "trajectory__model_version")
    live = related.filter(pk=live_id).first()
    if live is None or live.status != LiveSession.Status.ACTIVE or live.next_index != index:
        return
    trajectory = live.trajectory
    if index > 0:
        _renew_quietly(live)
    with live.observation.open("rb") as f:
        screenshot = f.read()
    observation_text, outline = page_outline(live)
    messages = build_messages(
        trajectory.task.instruction,
        history_of(trajectory, settings.LIVE_KEEP_IMAGES, frame_of(live)),
        screenshot,
        keep_images=settings.LIVE_KEEP_IMAGES,
        observation_text=observation_text,
    )
    model = trajectory.model_version
    try:
        if model is None:
            raise PolicyError("this trajectory has no model to propose actions")
        client = policy_for(model)
        try:
            batch = client.propose(
                messages,
                width=live.model_width,
                height=live.model_height,
                n=settings.LIVE_CANDIDATES,
                temperature=settings.LIVE_TEMPERATURE,
                max_tokens=settings.LIVE_MAX_TOKENS,
                greedy_first=settings.LIVE_GREEDY_FIRST,
                seed=step_seed(live.proposal_seed, index),
            )
        finally:
            client.close()
    except PolicyError as exc:
        updated = LiveSession.objects.filter(pk=live.pk, next_index=index).update(
            proposals=LiveSession.Proposals.FAILED,
            proposal_error=str(exc),
            candidates=[],
            updated_at=timezone.now(),
            observation_outline=outline,
        )
        if updated:
            push(trajectory.pk, "proposals", index=index, candidates=[], error=str(exc))
        return
    candidates = [shapes.from_proposal(p, batch.model) for p in batch.proposals]
    ready_at = timezone.now()
    updated = LiveSession.objects.filter(pk=live.pk, next_index=index, status=LiveSession.Status.ACTIVE).update(
        proposals=LiveSession.Proposals.READY,
        candidates=candidates,
        proposal_error="",
        proposal_latency_ms=round(batch.latency_ms),
        proposals_ready_at=ready_at,
        updated_at=ready_at,
        observation_outline=outline,
    )
    if updated:
        push(trajectory.pk, "proposals", index=index, candidates=candidates, error="", sent_at=ready_at.timestamp())


def request_proposals(live: LiveSession) -> None:
    queues.enqueue(queues.PROPOSE_LIVE, live.pk, live.next_index)


def retry_proposals(live: LiveSession, *, switch_to_active: bool = False) -> LiveSession:
    """Ask again for the current step's proposals (they failed, or the annotator wants new ones); with
    `switch_to_active`, the trajectory's proposer becomes the active model first (e.g. after a broken model was
    promoted and replaced). Refused while the session is not active."""
    with transaction.atomic():
        live = LiveSession.objects.select_for_update().select_related("trajectory").get(pk=live.pk)
        if live.status != LiveSession.Status.ACTIVE:
            raise Conflict(f"This live session is {live.get_status_display().lower()}; it takes no proposals.")
        if switch_to_active:
            active = ModelVersion.objects.filter(is_active=True).first()
            if active is None:
                raise Conflict("No model is active: an ML engineer must promote one first.")
            Trajectory.objects.filter(pk=live.trajectory_id).update(model_version=active, updated_at=timezone.now())
        live.proposals, live.candidates, live.proposal_error = LiveSession.Proposals.PENDING, [], ""
        live.proposals_ready_at = None
        live.save(update_fields=["proposals", "candidates", "proposal_error", "proposals_ready_at", "updated_at"])
    push(live.trajectory_id, "state", state=state_of(live))
    request_proposals(live)
    return live


# --- the annotator's decision ----------------------------------------------------------------------------------------


def check_override(thought: str, action_text: str, width: int, height: int) -> Proposal:
    """An annotator's action against the grammar and the model image; raises ActionSyntaxError or Invalid."""
    if len(thought) > 5000 or len(action_text) > 5000:
        raise Invalid("Thought and action are limited to 5,000 characters each.")
    checked = proposal_of(action_text, thought.strip(), parse_actions(action_text), width, height)
    if checked.error:
        raise Invalid(checked.error)
    return checked


@contextmanager
def timed(timings: dict[str, float] | None, name: str) -> Iterator[None]:
    """Add the block's wall time (ms) to `timings[name]` when timings are wanted (the step's Server-Timing)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + (time.perf_counter() - started) * 1000


def take_step(live: LiveSession, **decision: Any) -> Step:
    """The stored step of `run_step` (for callers that do not need the session as it is after the step)."""
    return run_step(live, **decision)[0]


def run_step(
    live: LiveSession,
    *,
    expected_index: int,
    candidate: int | None = None,
    thought: str = "",
    action_text: str = "",
    timings: dict[str, float] | None = None,
) -> tuple[Step, LiveSession]:
    """Run the accepted candidate (or the annotator's override) in the sandbox and store the step.

    Nothing runs unless the action is valid; a double submit of the same step gets a Conflict. The step is stored
    'executing' before its action is sent, outside the row lock, and completed after it ran: the stored steps never
    fall behind the desktop. An action whose result cannot be recorded leaves its step 'failed' (the desktop may have
    run it) and ends the session, so the trajectory says where its record stops. `timings` (when given) gets the
    wall time of each part in ms: reserve, sandbox (of which the service's own time and its settle wait), complete,
    push, enqueue. Returns the step and the session as the step left it (with the observation to show next)."""
    with timed(timings, "reserve"):
        step, session_id = _reserve_step(live, expected_index, candidate, thought, action_text)
    client = sandbox_for(live.trajectory_id)
    try:
        with timed(timings, "sandbox"):
            result = client.step(session_id, step.action_text, coordinates="screen")
    except ActionError as exc:  # refused before anything ran
        _unreserve(step)
        raise Invalid(f"The sandbox refused the action: {exc.detail}") from exc
    except SessionGoneError:
        _unreserve(step)
        end_live(live, "lease_lost", release=False)
        raise Conflict("The sandbox session has ended (its lease expired or its desktop died).") from None
    except SandboxError as exc:
        if isinstance(exc.__cause__, httpx.ConnectError):  # never reached the service: nothing ran
            _unreserve(step)
            raise
        _step_failed(live, step, f"the sandbox did not confirm the action: {exc.detail}")
        raise Conflict(f"The sandbox did not confirm the action ({exc.detail}); {FAILED_TAIL}") from exc
    finally:
        client.close()
    if timings is not None:
        timings["service"] = result.elapsed_ms
        timings["settle"] = float((result.settle or {}).get("waited_ms", 0.0))
    try:
        with timed(timings, "complete"):
            live = _complete_step(live, step, result)
    except (DatabaseError, OSError) as exc:
        log.exception("live session %s: step %s ran but could not be recorded", live.pk, step.index)
        _step_failed(live, step, f"the action ran but its result could not be recorded: {exc}")
        raise Conflict(f"The action ran but its result could not be recorded; {FAILED_TAIL}") from exc
    ending = next((ENDING_ACTIONS[a["type"]] for a in step.action["actions"] if a["type"] in ENDING_ACTIONS), None)
    if ending:
        live = end_live(live, ending)
    elif live.status == LiveSession.Status.ACTIVE:
        with timed(timings, "push"):  # after the answer, which carries the same state
            push_soon(live.trajectory_id, "step", step=step_json(step), state=state_of(live))
        with timed(timings, "enqueue"):
            request_proposals_soon(live)  # the worker also renews the lease, off the annotator's path
    return step, live


def _reserve_step(
    live: LiveSession, expected_index: int, candidate: int | None, thought: str, action_text: str
) -> tuple[Step, str]:
    """Check the decision and store its step as 'executing', in screen pixels, under the session's row lock; the
    step and the sandbox session to run it in. A step left 'executing' by a process that stopped while running it is
    settled as failed here."""
    with transaction.atomic():
        live = LiveSession.objects.select_for_update().select_related("trajectory").get(pk=live.pk)
        if live.status != LiveSession.Status.ACTIVE:
            raise Conflict(f"This live session is {live.get_status_display().lower()}; no more steps can be taken.")
        if expected_index != live.next_index:
            raise Conflict(f"Step {expected_index} was already taken; the session is at step {live.next_index}.")
        running = Step.objects.filter(trajectory_id=live.trajectory_id, index=live.next_index).first()
        if running is None:
            return _store_executing(live, candidate, thought, action_text), live.sandbox_session_id
        if running.created_at > timezone.now() - timedelta(seconds=STALE_EXECUTING_S):
            raise Conflict(f"Step {expected_index} is being run now.")
    _step_failed(live, running, "its result was never recorded (the process running it stopped)")
    raise Conflict(f"Step {running.index} was never completed; {FAILED_TAIL}")


def _store_executing(live: LiveSession, candidate: int | None, thought: str, action_text: str) -> Step:
    """The step of this decision, stored 'executing' (the caller holds the session's row lock)."""
    if candidate is not None:
        if live.proposals != LiveSession.Proposals.READY or not 0 <= candidate < len(live.candidates):
            raise Invalid(f"There is no proposal {candidate + 1} to accept for this step.")
        shown = live.candidates[candidate]
        if shown["error"]:
            raise Invalid(f"Proposal {candidate + 1} is invalid and cannot run: {shown['error']}")
        checked = Proposal.from_dict(shown)
        source = Step.Source.MODEL
    else:
        try:
            checked = check_override(thought, action_text, live.model_width, live.model_height)
        except ActionSyntaxError as exc:
            raise Invalid(f"The action does not parse ({exc}).") from exc
        source = Step.Source.HUMAN
    mapping = frame_of(live)
    screen_text, screen_actions = in_frame(checked.action_text, mapping.to_screen)
    with live.observation.open("rb") as f:
        before = f.read()
    step = Step(
        trajectory=live.trajectory,
        index=live.next_index,
        thought=checked.thought,
        action_text=screen_text,
        action={"actions": screen_actions},
        source=source,
        status=Step.Status.EXECUTING,
        candidates=[shapes.to_screen(c, mapping) for c in live.candidates],
        chosen_candidate=candidate,
        model_version_id=live.trajectory.model_version_id,
        screenshot_sha256=hashlib.sha256(before).hexdigest(),
        started_at=live.proposals_ready_at,
        model_latency_ms=live.proposal_latency_ms,
        settle=live.observation_settle,
        outline=live.observation_outline,
    )
    step.screenshot.save("step.jpg", ContentFile(before), save=False)
    step.save()
    return step


def _unreserve(step: Step) -> None:
    """Forget a step whose action never ran."""
    if Step.objects.filter(pk=step.pk, status=Step.Status.EXECUTING).delete()[0]:
        step.screenshot.delete(save=False)


def _complete_step(live: LiveSession, step: Step, result: StepResult) -> LiveSession:
    """Record that the step's action ran: the step is done and the session moves on to the next screen.

    Committed without waiting for the WAL flush (synchronous_commit off, this transaction only): should PostgreSQL
    itself crash in that moment, the step stays 'executing' and is settled as failed like any unrecorded step, so
    nothing is lost that the design does not already handle; the reservation before the action stays synchronous."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
        live = LiveSession.objects.select_for_update().select_related("trajectory").get(pk=live.pk)
        now = timezone.now()
        Step.objects.filter(pk=step.pk).update(status=Step.Status.DONE, finished_at=now)
        step.status, step.finished_at = Step.Status.DONE, now
        if live.status != LiveSession.Status.ACTIVE or live.next_index != step.index:
            return live  # ended while the action ran: the step is stored, the session stays as it is
        live.next_index += 1
        if result.observation_jpeg:
            live.observation.save(f"obs-{live.next_index:05d}.jpg", ContentFile(result.observation_jpeg), save=False)
            live.observation_settle = result.settle or {}
            live.observation_outline = None  # the next proposals read the new page's
        live.candidates, live.proposal_error, live.proposals_ready_at = [], "", None
        live.proposals = LiveSession.Proposals.PENDING
        live.lease_expires_at = now + timedelta(seconds=settings.LIVE_LEASE_TTL_S)
        live.save()
        Trajectory.objects.filter(pk=live.trajectory_id).update(updated_at=now)
    return live


def _step_failed(live: LiveSession, step: Step, why: str) -> None:
    """The step's action was sent but its result is not recorded: keep the step as failed and end the session (the
    desktop may be one action ahead of the stored steps). Best effort: if even this cannot be written, the step
    stays 'executing' and the next take_step settles it once it is stale."""
    try:
        with transaction.atomic():
            locked = LiveSession.objects.select_for_update().get(pk=live.pk)
            Step.objects.filter(pk=step.pk, status=Step.Status.EXECUTING).update(
                status=Step.Status.FAILED, error=why, finished_at=timezone.now()
            )
            if locked.next_index == step.index:
                LiveSession.objects.filter(pk=live.pk).update(next_index=step.index + 1)
    except DatabaseError:
        log.exception("live session %s: step %s could not be marked failed", live.pk, step.index)
        return
    step.status, step.error = Step.Status.FAILED, why
    end_live(live, "step_failed")


def end_live(live: LiveSession, reason: str, *, release: bool = True) -> LiveSession:
    """End the session: an ending action (`finished`/`call_user`/`fail`) has the task's evaluator score the desktop
    first (annotation_app.evaluation) and submits the trajectory for review; then the lease is released."""
    with transaction.atomic():
        live = LiveSession.objects.select_for_update().select_related("trajectory").get(pk=live.pk)
        if not live.open:
            return live
        live.status, live.end_reason, live.ended_at = LiveSession.Status.ENDED, reason, timezone.now()
        live.proposals, live.candidates = LiveSession.Proposals.NONE, []
        live.save()
        trajectory = live.trajectory
        trajectory.metadata = {**trajectory.metadata, "end_reason": reason}
        fields = ["metadata", "updated_at"]
        if reason not in ENDING_ACTIONS.values() and trajectory.status == Trajectory.Status.IN_PROGRESS:
            trajectory.status = Trajectory.Status.ABANDONED  # it can no longer be continued or submitted
            fields.append("status")
        trajectory.save(update_fields=fields)
    if release and live.sandbox_session_id:
        client = sandbox_for(live.trajectory_id)
        try:
            if reason in ENDING_ACTIONS.values():  # the agent ended it: score it on the desktop as it was left
                evaluate_trajectory(client, live.sandbox_session_id, trajectory, reason)
        finally:
            release_quietly(client, live.sandbox_session_id)
            client.close()
    if reason in ENDING_ACTIONS.values() and trajectory.status == Trajectory.Status.IN_PROGRESS:
        submit(trajectory)
    push(live.trajectory_id, "state", state=state_of(live))
    return live


def release_quietly(client: SandboxClient, session_id: str) -> None:
    try:
        client.release(session_id)
    except SandboxError as exc:  # already gone: that is the state we wanted
        log.info("release of sandbox session %s: %s", session_id, exc)


def _renew_quietly(live: LiveSession) -> None:
    try:
        renew(live)
    except SandboxError as exc:
        log.warning("renewing the lease of live session %s failed: %s", live.pk, exc)


# --- what the page and the API show ----------------------------------------------------------------------------------


def step_json(step: Step) -> dict[str, Any]:
    return {
        "index": step.index,
        "thought": step.thought,
        "action_text": step.action_text,
        "source": step.source,
        "chosen_candidate": step.chosen_candidate,
        "screenshot_url": step.screenshot.url if step.screenshot else "",
    }


def state_of(live: LiveSession) -> dict[str, Any]:
    return {
        "trajectory": live.trajectory_id,
        "status": live.status,
        "kind": live.kind,
        "next_index": live.next_index,
        "model_width": live.model_width,
        "model_height": live.model_height,
        "observation_url": live.observation.url if live.observation else "",
        "proposals": live.proposals,
        "candidates": live.candidates,
        "proposal_error": live.proposal_error,
        "error": live.error,
        "end_reason": live.end_reason,
        "evaluation": live.trajectory.metadata.get("evaluation") if live.status == LiveSession.Status.ENDED else None,
    }
