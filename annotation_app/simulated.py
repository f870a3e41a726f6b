"""Simulated annotators (issue 16): programs that do live interactive annotation through the real HTTP API.

A simulated annotator is a `User` with `is_simulated=True` and an API token. `annotate_tasks` drives the live API as a
script would (POST /api/live/ naming the task, poll the state for the model's proposals, GET the session's oracle
state, POST a step), accepting a proposal when `sandbox.suite.accepts` says it does what the suite's oracle would do
and overriding it with the oracle's action otherwise: the on-policy corrections of the UI-TARS-2 report, §2.4.2.
`acceptance` sums what was accepted from the stored steps. Their trajectories are marked `simulated`.

Server side, `claim` lets a simulated annotator take a named task (people take tasks from the queue) and
`oracle_state` reads a session's ground truth for the oracle; the live API exposes both to simulated users only.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from django.db import transaction
from rest_framework.authtoken.models import Token

from sandbox import suite
from sandbox.actions import format_actions, parse_actions
from sandbox.coordinates import ScreenMapping, map_points, mapping_for
from sandbox.outline import parse as parse_outline
from sandbox.suite.demos import demonstration_turn
from sandbox.suite.run import read_state

from . import task_queue
from .live import sessions as live
from .models import Assignment, LiveSession, Role, Step, Task, Trajectory, User
from .trajectories import Conflict

log = logging.getLogger(__name__)
Progress = Callable[[dict[str, Any]], None]
NAME = "sim-annotator-{}"
POLL_S = 0.2  # how often the state is polled while the desktop starts or the model proposes
START_TIMEOUT_S = 300.0  # a desktop starting on a loaded machine
PROPOSAL_TIMEOUT_S = 180.0  # after this, the step is taken without proposals (counted as no_proposals)


# --- server side: the users, the named task, the ground truth ---------------------------------------------------------


def simulated_annotators(n: int) -> list[User]:
    """`n` simulated annotators named sim-annotator-1 … sim-annotator-n (created once, reused after), with tokens.
    They cannot log in with a password: they use the API with their token."""
    if n < 1:
        raise ValueError(f"at least one simulated annotator is needed, got {n}")
    users = []
    for i in range(1, n + 1):
        user, created = User.objects.get_or_create(
            username=NAME.format(i), defaults={"role": Role.ANNOTATOR, "is_simulated": True}
        )
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        elif not user.is_simulated or user.role != Role.ANNOTATOR:
            raise Conflict(f"User {user.username!r} exists and is not a simulated annotator; rename it first.")
        Token.objects.get_or_create(user=user)
        users.append(user)
    return users


def claim(annotator: User, task: Task) -> Assignment:
    """Assign `task` to a simulated annotator (a flywheel iteration names its tasks; people use the queue). A task
    they already hold is returned; another task they hold is handed back (its live session ended, as a skip does);
    a task someone else holds now, or an archived one, is a Conflict. A completed task may be annotated again."""
    if not annotator.is_simulated:
        raise Conflict("Only simulated annotators take a named task; people take tasks from the queue.")
    current = Assignment.objects.filter(annotator=annotator, status=Assignment.Status.ACTIVE).first()
    if current is not None and current.task_id == task.pk:
        return current
    if current is not None:
        open_sessions = LiveSession.objects.filter(
            trajectory__annotator=annotator, trajectory__task_id=current.task_id,
            status__in=[LiveSession.Status.STARTING, LiveSession.Status.ACTIVE],
        )  # fmt: skip
        for session in open_sessions:
            live.end_live(session, "skipped")
        with transaction.atomic():
            task_queue._finish(current, Assignment.Status.SKIPPED)  # the queue's own release: its task reopens
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.status == Task.Status.ARCHIVED:
            raise Conflict(f"Task {task.pk} is archived.")
        if Assignment.objects.filter(task=locked, status=Assignment.Status.ACTIVE).exists():
            raise Conflict(f"Task {task.pk} is being annotated by someone else now.")
        assignment = Assignment.objects.create(task=locked, annotator=annotator)
        task_queue._settle(locked, "claimed")  # the queue's rule: assigned once its k slots are taken
        return assignment


def oracle_state(session: LiveSession) -> dict[str, Any]:
    """The ground truth of an active session's task as the suite's oracle reads it (`sandbox.suite.run.read_state`),
    with the frames needed to compare its screen-pixel actions with the model-frame proposals."""
    if session.status != LiveSession.Status.ACTIVE:
        raise Conflict(f"This live session is {session.get_status_display().lower()}; its desktop is not running.")
    trajectory = Trajectory.objects.select_related("task").get(pk=session.trajectory_id)
    family = (trajectory.task.metadata or {}).get("suite")
    if not family:
        raise Conflict("This task is not from the bundled task suite: it has no oracle.")
    client = live.sandbox_for(session.trajectory_id)
    try:
        state = read_state(client, session.sandbox_session_id, trajectory.task)
    except RuntimeError as exc:
        raise Conflict(f"The session's state could not be read: {exc}") from exc
    finally:
        client.close()
    outline = session.observation_outline  # what the proposals were made on, else the page's outline now
    if outline is None:
        outline = live.page_outline(session)[1]
    return {
        "trajectory": session.trajectory_id,
        "next_index": session.next_index,
        "family": family,
        "metadata": trajectory.task.metadata,
        "screen_width": trajectory.screen_width,
        "screen_height": trajectory.screen_height,
        "model_width": session.model_width,
        "model_height": session.model_height,
        "state": state,
        "outline": outline or [],
    }


# --- client side: an annotator driving the live API -------------------------------------------------------------------


class SimulationError(Exception):
    """The live API refused a request or a session did not get where it had to."""


def annotate_tasks(
    base_url: str,
    tasks: Sequence[Task | int],
    annotators: Sequence[User],
    *,
    seed: int,
    mistake_rate: float = 0.0,
    max_steps: int = 15,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Annotate every suite task live through the web stack at `base_url` (e.g. http://127.0.0.1:8000), spread over
    `annotators` (one thread each, each one task at a time); an active annotation model must be promoted first.

    Per step: accept the first valid proposal the oracle agrees with, else override with the oracle's action; with
    probability `mistake_rate` (drawn from `seed`, the task and the step) override with the family's wrong action
    instead. A trajectory ends when the oracle says finished (the step is a `finished()`, so the task's verifier
    scores it) or is abandoned after `max_steps`. `progress`, when given, is called after each trajectory with its
    result. Returns one dict per task, in the order given: trajectory (id), task (id), annotator (username), steps,
    accepted, overridden, no_proposals, mistakes, end_reason, outcome (the verifier's score, None when it was not
    scored), error (why a task could not be annotated, "" otherwise)."""
    if not annotators:
        raise ValueError("no annotators to annotate with")
    if not 0.0 <= mistake_rate <= 1.0:
        raise ValueError(f"mistake_rate must be within 0 and 1, got {mistake_rate}")
    if not all(a.is_simulated for a in annotators):
        raise ValueError("every annotator must be a simulated one (simulated_annotators(n))")
    rows = [t if isinstance(t, Task) else Task.objects.get(pk=t) for t in tasks]
    for task in rows:
        suite.spec_of(task)  # ValueError now for a task that is not from the suite
    tokens = {a.pk: Token.objects.get_or_create(user=a)[0].key for a in annotators}
    results: list[dict[str, Any] | None] = [None] * len(rows)
    lock = threading.Lock()

    def work(annotator: User, mine: list[int]) -> None:
        with httpx.Client(
            base_url=base_url.rstrip("/"), headers={"Authorization": f"Token {tokens[annotator.pk]}"}, timeout=300
        ) as http:
            for n in mine:
                agent = Annotator(http, annotator.username, seed=seed, mistake_rate=mistake_rate, max_steps=max_steps)
                result = agent.annotate(rows[n])
                with lock:
                    results[n] = result
                    if progress is not None:
                        progress(result)

    shares = [list(range(i, len(rows), len(annotators))) for i in range(len(annotators))]
    pairs = [(a, s) for a, s in zip(annotators, shares, strict=True) if s]
    threads = [threading.Thread(target=work, args=pair, name=pair[0].username) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None]


class Annotator:
    """One simulated annotator's session loop over the live API (its `http` carries the annotator's token)."""

    def __init__(self, http: httpx.Client, username: str, *, seed: int, mistake_rate: float, max_steps: int) -> None:
        self.http, self.username = http, username
        self.seed, self.mistake_rate, self.max_steps = seed, mistake_rate, max_steps

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One API request; a refusal raises SimulationError with the API's message."""
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text[:300]
            raise SimulationError(f"{method} {path}: {response.status_code} {detail}")
        return response.json()

    def annotate(self, task: Task) -> dict[str, Any]:
        """Open the task live, play it to the end and return its result (an error is recorded, not raised)."""
        result: dict[str, Any] = {
            "trajectory": None, "task": task.pk, "annotator": self.username, "steps": 0, "accepted": 0,
            "overridden": 0, "no_proposals": 0, "mistakes": 0, "end_reason": "", "outcome": None, "error": "",
        }  # fmt: skip
        try:
            state = self.call("POST", "/api/live/", json={"task": task.pk, "seed": session_seed(self.seed, task)})
            result["trajectory"] = pk = state["trajectory"]
            state = self.wait(pk, 0, START_TIMEOUT_S + PROPOSAL_TIMEOUT_S)
            while state["status"] == LiveSession.Status.ACTIVE and result["steps"] < self.max_steps:
                state = self.step(pk, task, state, result)
            if state["status"] == LiveSession.Status.ACTIVE:
                self.call("POST", f"/api/live/{pk}/end/", json={"reason": "abandoned"})
            state = self.call("GET", f"/api/live/{pk}/")
        except Exception as exc:  # recorded per task: one broken session must not stop an iteration's annotation
            if not isinstance(exc, SimulationError | httpx.HTTPError):
                log.exception("simulated annotation of task %s failed", task.pk)
            result["error"] = f"{type(exc).__name__}: {exc}"
            if result["trajectory"] is not None:
                try:
                    self.call("POST", f"/api/live/{result['trajectory']}/end/", json={"reason": "abandoned"})
                except (SimulationError, httpx.HTTPError):
                    pass  # already ended, or the stack is down: the lease expires by itself
            return result
        evaluation = state.get("evaluation") or {}
        result["end_reason"] = state["end_reason"] or state["error"]
        result["outcome"] = evaluation.get("score") if evaluation.get("status") == "scored" else None
        return result

    def wait(self, pk: int, index: int, timeout_s: float) -> dict[str, Any]:
        """The session's state once step `index`'s proposals are in (ready or failed) or the session is over; at the
        timeout the state as it is (the step is then taken without proposals)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.call("GET", f"/api/live/{pk}/")
            if state["status"] in (LiveSession.Status.ENDED, LiveSession.Status.FAILED):
                return state
            ready = state["status"] == LiveSession.Status.ACTIVE and state["proposals"] in ("ready", "failed")
            if (ready and state["next_index"] == index) or time.monotonic() > deadline:
                if state["status"] != LiveSession.Status.ACTIVE:
                    raise SimulationError(f"live session {pk} did not start within {timeout_s:.0f} s")
                return state
            time.sleep(POLL_S)

    def step(self, pk: int, task: Task, state: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        """Decide one step from the oracle's view and post it; the session's state after it (proposals in)."""
        index = state["next_index"]
        truth = self.call("GET", f"/api/live/{pk}/oracle-state/")
        family, page = truth["family"], truth["state"]
        frame = mapping_for(truth["screen_width"], truth["screen_height"], truth["model_width"], truth["model_height"])
        right = suite.oracle_action(family, task, page)
        draw = mistake_draw(self.seed, task, index)
        body: dict[str, Any] = {"expected_index": index}
        candidates = state["candidates"] if state["proposals"] == "ready" else []
        if not candidates:
            result["no_proposals"] += 1
        if draw < self.mistake_rate and not right.startswith("finished("):
            body |= override(suite.wrong_action(family, task, page), frame, truth.get("outline"))
            result["mistakes"] += 1
            result["overridden"] += bool(candidates)
        elif (choice := agreeing(candidates, family, task, page, frame)) is not None:
            body["candidate"] = choice
            result["accepted"] += 1
        else:
            body |= override(right, frame, truth.get("outline"))
            result["overridden"] += bool(candidates)
        answer = self.call("POST", f"/api/live/{pk}/step/", json=body)
        result["steps"] += 1
        after = answer["state"]
        if after["status"] != LiveSession.Status.ACTIVE:
            return after
        return self.wait(pk, index + 1, PROPOSAL_TIMEOUT_S)


def session_seed(seed: int, task: Task) -> int:
    """The seed of a live session's sampled proposals: from the run's seed and the suite instance, as the mistakes."""
    meta = task.metadata
    return random.Random(f"{seed}:live:{meta['suite']}:{meta['seed']}:{meta['difficulty']}").randrange(2**31)


def mistake_draw(seed: int, task: Task, index: int) -> float:
    """The uniform draw that decides whether step `index` of `task` is a mistake (below `mistake_rate`): fixed by the
    run's seed and the suite instance, not by database ids or thread order, so a run can be repeated."""
    meta = task.metadata
    return random.Random(f"{seed}:{meta['suite']}:{meta['seed']}:{meta['difficulty']}:{index}").random()


def agreeing(
    candidates: list[dict[str, Any]], family: str, task: Task, state: dict[str, Any], frame: ScreenMapping
) -> int | None:
    """The first valid candidate (model frame) that does what the oracle would do in `state`, or None."""
    for n, candidate in enumerate(candidates):
        if candidate.get("error") or not candidate.get("action_text"):
            continue
        on_screen = format_actions(map_points(parse_actions(candidate["action_text"]), frame.to_screen))
        if suite.accepts(family, task, state, on_screen):
            return n
    return None


def override(action_text: str, frame: ScreenMapping, outline: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """An override's body: the oracle's screen-pixel action in the model frame the API takes, with the thought and
    the point the bootstrap demonstrations use (sandbox.suite.demos.demonstration_turn: a click on an element of
    the page's outline names it and goes to its centre), so the SFT store holds one way of writing a step."""
    elements = parse_outline({"elements": outline or []})
    thought, model_action = demonstration_turn(action_text, frame, elements)
    return {"thought": thought, "action_text": model_action}


# --- figures ----------------------------------------------------------------------------------------------------------


def acceptance(trajectory_ids: Sequence[int]) -> dict[str, Any]:
    """How the annotators treated the model's proposals in these trajectories, from the stored steps: accepted (a
    candidate chosen as-is), overridden (candidates shown, the annotator's own action taken), total (steps with
    candidates) and rate (accepted / total, None without candidates)."""
    steps = Step.objects.filter(trajectory_id__in=list(trajectory_ids))
    shown = steps.exclude(candidates=[])
    total = shown.count()
    accepted = shown.filter(chosen_candidate__isnull=False).count()
    return {
        "trajectories": len(set(trajectory_ids)),
        "steps": steps.count(),
        "total": total,
        "accepted": accepted,
        "overridden": total - accepted,
        "rate": accepted / total if total else None,
    }
