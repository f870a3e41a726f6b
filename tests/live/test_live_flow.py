"""A live session through the real services: sandbox desktop, embedded policy server, a Celery worker on `live`.

Domain functions are called directly here; the page and the browser are covered by test_live_browser.py."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from annotation_app.candidates import candidate
from annotation_app.consumers import LiveConsumer
from annotation_app.live import sessions as live
from annotation_app.models import LiveSession, Role, Step, Trajectory
from annotation_app.task_queue import next_task
from annotation_app.trajectories import Conflict, Invalid
from sandbox.client import SessionGoneError
from sandbox.coordinates import ScreenMapping

from ..conftest import api_client_for
from ..factories import TaskFactory
from ..waiting import wait_for
from .conftest import needs_desktop

pytestmark = [needs_desktop, pytest.mark.slow]


# The proposals the flow test accepts: pointer actions, whose effect on the desktop is always seen (a hotkey such as
# shift alone, or type with an empty text, may leave the screen as it was).
POINTER_ACTIONS = {"click", "left_double", "right_single", "drag", "scroll"}
# A terminal over the whole screen that shows the input it gets: mouse reporting on (a click or a wheel notch prints
# its escape sequence), signals off (a hotkey shows as ^C instead of ending it), so every accepted action is seen.
# Full screen and without an inner border (over the panel too): any point the tiny model proposes is inside it.
ECHO_TERMINAL = ["xterm", "-fullscreen", "-b", "0", "-e", "sh", "-c"]
ECHO_INPUT = "printf '\\033[?1000h'; stty -isig; while :; do cat; done"
REFUSE_DONE = """
CREATE FUNCTION refuse_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'disk full'; END $$;
CREATE TRIGGER refuse_done BEFORE UPDATE ON annotation_app_step FOR EACH ROW WHEN (NEW.status = 'done')
EXECUTE FUNCTION refuse_done();
"""


def input_events(archive: bytes) -> list[dict]:
    """The input events of a sandbox capture archive (docs/in-situ.md)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return [json.loads(line) for line in tar.extractfile("events.jsonl").read().splitlines() if line.strip()]


def proposals_ready(session: LiveSession, index: int) -> bool:
    session.refresh_from_db()
    return session.next_index == index and session.proposals in ("ready", "failed")


@pytest.fixture
def started(live_worker, embedded_model, make_user):
    """An annotator's live session on a desktop task, started by the worker, with its first proposals ready."""
    annotator = make_user(Role.ANNOTATOR)
    setup = [{"type": "launch", "parameters": {"command": [*ECHO_TERMINAL, ECHO_INPUT]}}]
    task = TaskFactory(instruction="Open a terminal and type hello.", setup_config=setup)
    next_task(annotator)
    session = live.open_live(annotator, task)
    assert wait_for(lambda: proposals_ready(session, 0), timeout=90), live_worker.read_text()[-3000:]
    yield annotator, session
    if session.open:
        live.end_live(session, "abandoned")


def test_accept_override_finish_stores_the_on_policy_trajectory(started):
    annotator, session = started
    assert session.status == "active" and session.proposals == "ready", session.proposal_error
    assert session.model_width > 0 and session.observation and len(session.candidates) == 3
    assert all(c["model"] == "tiny-uitars" and not c["error"] for c in session.candidates)
    assert live.open_live(annotator, session.trajectory.task).pk == session.pk  # reopening resumes

    pointing = [i for i, c in enumerate(session.candidates) if c["actions"][0]["type"] in POINTER_ACTIONS]
    if pointing:
        choice = pointing[0]
    else:  # what an untrained model proposes is anyone's guess: have it propose a click in the middle instead
        choice, middle = 0, (session.model_width // 2, session.model_height // 2)
        proposed = candidate(
            thought="Click the terminal.", action_text=f"click(start_box='{middle}')", model="tiny-uitars"
        )
        LiveSession.objects.filter(pk=session.pk).update(candidates=[proposed, *session.candidates[1:]])
        session.refresh_from_db()
    shown = session.candidates[choice]
    first_screen = session.observation.read()
    sandbox = live.sandbox_for(session.trajectory_id)
    sandbox.capture_start(session.sandbox_session_id)  # the desktop's own record of the input it receives
    step = live.take_step(session, expected_index=0, candidate=choice)
    events = input_events(sandbox.capture_stop(session.sandbox_session_id))
    assert step.source == Step.Source.MODEL and step.chosen_candidate == choice and len(step.candidates) == 3
    # stored in screen pixels: each model point maps to the screen pixel the sandbox always clicked for it
    trajectory = Trajectory.objects.get(pk=session.trajectory_id)
    mapping = ScreenMapping(trajectory.screen_width, trajectory.screen_height)
    screen = (trajectory.screen_width, trajectory.screen_height)
    assert (session.model_width, session.model_height) == mapping.model_size != screen  # two frames apart
    screen_points = [list(mapping.to_screen(x, y)) for x, y in shown["points"]]
    assert step.candidates[choice]["points"] == screen_points and step.candidates[choice]["raw"] == shown["raw"]
    assert [p for a in step.action["actions"] for k in ("point", "start", "end") if (p := a.get(k))] == screen_points
    assert step.status == Step.Status.DONE and step.action_text == step.candidates[choice]["action_text"]
    # ... and the accepted action reached the desktop there, and changed the screen
    session.refresh_from_db()
    assert session.observation.read() != first_screen, shown
    kinds = {e["type"] for e in events}
    for x, y in screen_points:
        assert any(e.get("x") == x and e.get("y") == y for e in events), (screen_points, events)
    assert kinds & {"down", "scroll"}, events
    assert (
        step.screenshot_sha256
        == hashlib.sha256(first_screen).hexdigest()
        == hashlib.sha256(step.screenshot.read()).hexdigest()
    )
    assert step.model_version_id == session.trajectory.model_version_id and step.finished_at

    with pytest.raises(Conflict, match="already taken"):  # a double click on the same proposal
        live.take_step(session, expected_index=0, candidate=choice)
    assert wait_for(lambda: proposals_ready(session, 1), timeout=60)

    session.refresh_from_db()
    before_typing = session.observation.read()
    typed = live.take_step(session, expected_index=1, thought="Type the word.", action_text="type(content='hello')")
    assert typed.source == Step.Source.HUMAN and typed.chosen_candidate is None
    session.refresh_from_db()
    assert session.observation.read() != before_typing  # the typed word is on the screen now
    assert typed.action == {"actions": [{"type": "type", "content": "hello"}]} and typed.thought == "Type the word."

    live.take_step(session, expected_index=2, thought="Done.", action_text="finished(content='typed hello')")
    session.refresh_from_db()
    trajectory = Trajectory.objects.get(pk=session.trajectory_id)
    assert session.status == "ended" and session.end_reason == "finished"
    assert trajectory.status == Trajectory.Status.SUBMITTED and trajectory.mode == Trajectory.Mode.INTERACTIVE
    assert [s.source for s in trajectory.steps.order_by("index")] == ["model", "human", "human"]
    with pytest.raises(SessionGoneError):  # the lease was released
        live.sandbox_for(session.trajectory_id).renew(session.sandbox_session_id)


def test_a_step_whose_result_cannot_be_recorded_is_kept_as_failed(started):
    """The action runs, then storing its result fails (the database refuses it): the step stays recorded, as failed,
    so the stored steps never fall behind the desktop, and the session ends."""
    _, session = started
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_DONE)
    try:
        with pytest.raises(Conflict, match="ran but its result could not be recorded"):
            live.take_step(session, expected_index=0, thought="Type.", action_text="type(content='ran')")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_done ON annotation_app_step; DROP FUNCTION refuse_done();")
    step = Step.objects.get(trajectory=session.trajectory, index=0)
    assert step.status == Step.Status.FAILED and "could not be recorded" in step.error and "disk full" in step.error
    assert step.action_text == "type(content='ran')" and step.finished_at
    session.refresh_from_db()
    assert (session.status, session.end_reason, session.next_index) == ("ended", "step_failed", 1)
    with pytest.raises(SessionGoneError):  # the desktop was given back
        live.sandbox_for(session.trajectory_id).renew(session.sandbox_session_id)


def test_a_step_left_executing_is_settled_by_the_next_one(db, make_user):
    """A process that died while running a step left it 'executing': a fresh one is in progress (409), a stale one
    is recorded as failed and ends the session."""
    owner = make_user(Role.ANNOTATOR)
    trajectory = Trajectory.objects.create(task=TaskFactory(), annotator=owner, mode="interactive")
    session = LiveSession.objects.create(trajectory=trajectory, status="active", model_width=1932, model_height=1092)
    Step.objects.create(trajectory=trajectory, index=0, action_text="wait()", status=Step.Status.EXECUTING)
    with pytest.raises(Conflict, match="Step 0 is being run now"):
        live.take_step(session, expected_index=0, action_text="wait()")
    stale = timezone.now() - timedelta(seconds=live.STALE_EXECUTING_S + 1)
    Step.objects.filter(trajectory=trajectory).update(created_at=stale)
    with pytest.raises(Conflict, match="Step 0 was never completed"):
        live.take_step(session, expected_index=0, action_text="wait()")
    step = Step.objects.get(trajectory=trajectory)
    assert step.status == Step.Status.FAILED and "never recorded" in step.error
    session.refresh_from_db()
    assert (session.status, session.end_reason, session.next_index) == ("ended", "step_failed", 1)


def test_invalid_overrides_are_rejected_and_nothing_runs(started):
    _, session = started
    before = session.observation.read()
    cases = [
        ("click(start_box='(5,5)'", "does not parse"),  # unbalanced
        ("click(start_box='<|box_start|>(99999,5)<|box_end|>')", "outside the"),
        ("fly(to='moon')", "does not parse"),
        ("type(content='it's')", "does not parse"),  # unbalanced quotes
    ]
    for action_text, message in cases:
        with pytest.raises(Invalid, match=message):
            live.take_step(session, expected_index=0, thought="", action_text=action_text)
    session.refresh_from_db()
    assert session.next_index == 0 and not Step.objects.filter(trajectory=session.trajectory).exists()
    assert session.observation.read() == before
    response = api_client_for(session.trajectory.annotator).post(
        reverse("live-step", args=[session.trajectory_id]),
        {"expected_index": 0, "action_text": "click(start_box='(1,1)'"},
        format="json",
    )
    assert response.status_code == 400 and "does not parse" in response.json()["detail"]
    with pytest.raises(Invalid, match="no proposal 9"):
        live.take_step(session, expected_index=0, candidate=8)


def test_the_api_validates_as_you_type_and_only_the_owner_gets_in(started, make_user):
    annotator, session = started
    url = reverse("live-validate", args=[session.trajectory_id])
    ok = api_client_for(annotator).post(url, {"action_text": "click(start_box='(10,20)')"}, format="json").json()
    assert ok == {"valid": True, "errors": [], "action_text": "click(start_box='<|box_start|>(10,20)<|box_end|>')",
                  "points": [[10, 20]]}  # fmt: skip
    bad = api_client_for(annotator).post(url, {"action_text": "click(start_box='(1,2)"}, format="json").json()
    assert not bad["valid"] and bad["errors"][0]["column"] >= 1
    token = api_client_for(annotator).post(reverse("live-vnc-token", args=[session.trajectory_id]))
    assert token.status_code == 201 and token.json()["token"]

    other = make_user(Role.ANNOTATOR)
    for name, method in [("live-state", "get"), ("live-step", "post"), ("live-validate", "post"),
                         ("live-end", "post"), ("live-vnc-token", "post")]:  # fmt: skip
        url = reverse(name, args=[session.trajectory_id])
        response = getattr(api_client_for(other), method)(url, {}, format="json")
        assert response.status_code == 404, name
    client = api_client_for(other)
    client.force_login(other)
    assert client.get(reverse("live", args=[session.trajectory_id])).status_code == 404


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_only_the_owner_can_watch_over_the_websocket(make_user, embedded_model):
    owner, other = await sync_to_async(make_user)(Role.ANNOTATOR), await sync_to_async(make_user)(Role.ANNOTATOR)
    task = await sync_to_async(TaskFactory)()
    trajectory = await Trajectory.objects.acreate(task=task, annotator=owner, mode="interactive")
    await LiveSession.objects.acreate(trajectory=trajectory, status="active", model_width=10, model_height=10)
    path = f"/ws/live/{trajectory.pk}/"
    watcher = WebsocketCommunicator(LiveConsumer.as_asgi(), path)
    watcher.scope.update(user=other, url_route={"kwargs": {"pk": trajectory.pk}})
    connected, code = await watcher.connect()
    assert not connected and code == 4404
    mine = WebsocketCommunicator(LiveConsumer.as_asgi(), path)
    mine.scope.update(user=owner, url_route={"kwargs": {"pk": trajectory.pk}})
    assert (await mine.connect())[0]
    first = await mine.receive_json_from(timeout=5)
    assert first["event"] == "state" and first["state"]["status"] == "active"
    await sync_to_async(live.push)(trajectory.pk, "proposals", index=0, candidates=[], error="x")
    assert (await mine.receive_json_from(timeout=5))["event"] == "proposals"
    await mine.disconnect()
    await sync_to_async(lambda: connection.close())()


def test_no_active_model_is_a_clear_conflict(db, make_user):
    annotator = make_user(Role.ANNOTATOR)
    task = TaskFactory()
    next_task(annotator)
    with pytest.raises(Conflict, match="No annotation model is active"):
        live.open_live(annotator, task)


def test_opening_live_over_the_api_needs_a_task_and_a_model(db, make_user):
    annotator = make_user(Role.ANNOTATOR)
    client = api_client_for(annotator)
    response = client.post(reverse("live-open"))
    assert response.status_code == 409 and "take one from the queue" in response.json()["detail"]
    TaskFactory()
    next_task(annotator)
    response = client.post(reverse("live-open"))
    assert response.status_code == 409 and "No annotation model is active" in response.json()["detail"]


def test_browser_sessions_have_no_vnc_token_but_a_clear_answer(db, make_user):
    owner = make_user(Role.ANNOTATOR)
    trajectory = Trajectory.objects.create(task=TaskFactory(platform="browser"), annotator=owner, mode="interactive")
    LiveSession.objects.create(trajectory=trajectory, status="active", kind="browser", model_width=10, model_height=10)
    response = api_client_for(owner).post(reverse("live-vnc-token", args=[trajectory.pk]))
    assert response.status_code == 409 and "no VNC screen" in response.json()["detail"]


def test_promoting_another_model_changes_new_sessions_only(db, make_user, settings):
    from flywheel.models import ModelVersion

    first = ModelVersion.objects.create(name="m1", checkpoint_uri="a", endpoint_url="http://127.0.0.1:9/v1")
    first.promote()
    annotator = make_user(Role.ANNOTATOR)
    TaskFactory(importance=2), TaskFactory(importance=1)
    next_task(annotator)
    before = live.open_live(annotator, annotator.assignments.get(status="active").task)
    second = ModelVersion.objects.create(name="m2", checkpoint_uri="b", endpoint_url="http://127.0.0.1:9/v1")
    second.promote()  # no restart: the next session asks the new model
    next_task(annotator, skip_current=True)
    after = live.open_live(annotator, annotator.assignments.get(status="active").task)
    assert before.trajectory.model_version == first and after.trajectory.model_version == second
    before.trajectory.refresh_from_db()
    assert before.trajectory.model_version == first  # each trajectory keeps the model it was collected with
