"""The live step's latency cuts keep observations fresh, and the step says where its time went.

- The settle wait skips its grace only when nothing but the window manager could react to the action; what the
  window manager draws then (a root menu) is still in the observation, and an action on an application still waits.
- The step's parts are in its Server-Timing header (web app and sandbox service), for bench/live.py.
- Pushes go through one lasting channel-layer loop per process, and still reach the page's websocket.
These check what happened (which rule ended the wait, what the screenshot shows), never how long it took.
"""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
from PIL import Image, ImageChops

from sandbox.actions import Click, Point, RightSingle, Type
from sandbox.desktop import Desktop, available

from ..waiting import wait_for

needs_desktop = pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc")


@pytest.fixture
def desktop(tmp_path):
    desktop = Desktop.start(tmp_path / "home", 640, 400)
    yield desktop
    desktop.stop()


def _changed(before: bytes, after: bytes) -> bool:
    first, second = (Image.open(io.BytesIO(b)).convert("RGB") for b in (before, after))
    return ImageChops.difference(first, second).getbbox() is not None


BARE = Point(320, 150)  # the wallpaper: above the panel, no window there


@needs_desktop
def test_a_click_on_the_bare_desktop_ends_on_the_window_managers_answer(desktop):
    assert desktop.untargeted()
    desktop.execute(Click(BARE))
    settled = desktop.settle(grace_s=30, since_action=True)  # a grace no machine reaches: the answer ends it
    assert settled.ended_by == "window_manager" and settled.redraws == 0 and not settled.timed_out


@needs_desktop
def test_what_the_window_manager_draws_on_a_bare_desktop_is_in_the_observation(desktop):
    """openbox opens its root menu on a right click: it draws before it answers, so the wait sees the drawing and
    the screenshot shows the menu."""
    before = desktop.screenshot(fmt="png")
    desktop.execute(RightSingle(BARE))
    settled = desktop.settle(since_action=True)
    after = desktop.screenshot(fmt="png")
    assert settled.redraws >= 1 and settled.ended_by != "window_manager"
    assert _changed(before, after), "the root menu is missing from the settled observation"


@needs_desktop
def test_an_action_on_an_application_still_waits_for_it(desktop):
    """A terminal that prints a line when Enter comes: input reaches an application, so the window manager's answer
    does not end the wait, and the line is in the observation."""
    desktop.launch(["xterm", "-geometry", "40x5+0+0", "-e", "sh", "-c", "stty -echo; read line; echo DRAWN; sleep 60"])
    assert wait_for(lambda: any(cls == "XTerm" for cls, _ in desktop.windows())), "xterm never showed a window"
    desktop.execute(Click(Point(40, 40)))  # focus the terminal
    desktop.settle(cap_s=5, since_action=True)
    assert not desktop.untargeted()
    before = desktop.screenshot(fmt="png")
    desktop.execute(Type("go\n"))
    settled = desktop.settle(grace_s=2.0, since_action=True)
    after = desktop.screenshot(fmt="png")
    assert settled.ended_by in ("quiet", "cap") and settled.redraws >= 1
    assert _changed(before, after), "the printed line is missing from the settled observation"


@needs_desktop
@pytest.mark.slow
def test_a_live_step_says_where_its_time_went(live_worker, embedded_model, make_user):
    """The step API's Server-Timing header names each part (bench/live.py reads it from the page), and the step is
    stored done with the settled observation; the answer carries that stored observation inline when asked (the
    page shows it without a second request), and the step's event still reaches the page's websocket group."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from annotation_app.live import sessions as live
    from annotation_app.models import LiveSession, Role, Step
    from annotation_app.task_queue import next_task

    from ..conftest import api_client_for
    from ..factories import TaskFactory

    annotator = make_user(Role.ANNOTATOR)
    setup = [{"type": "launch", "parameters": {"command": ["xterm", "-maximized"]}}]
    task = TaskFactory(instruction="Type in the terminal.", setup_config=setup)
    next_task(annotator)
    session = live.open_live(annotator, task)
    assert wait_for(lambda: LiveSession.objects.get(pk=session.pk).status == "active", timeout=120)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(live.group(session.trajectory_id), channel)
    client = api_client_for(annotator)
    response = client.post(
        f"/api/live/{session.trajectory_id}/step/?observation=inline",
        {"expected_index": 0, "action_text": "type(content='ls\\n')"},
        format="json",
    )
    assert response.status_code == 201, response.content
    stored = LiveSession.objects.get(pk=session.pk).observation
    assert response.json()["state"]["observation_url"] == stored.url and "obs-00001" in stored.name
    with stored.open("rb") as f:
        assert base64.b64decode(response.json()["observation_jpeg_base64"]) == f.read()

    async def pushed() -> dict:  # the step's event; the start's state and the proposals may come before it
        while (message := await asyncio.wait_for(layer.receive(channel), timeout=60))["event"] != "step":
            pass
        return message

    event = async_to_sync(pushed)()
    assert event["event"] == "step" and event["state"]["next_index"] == 1 and event["step"]["index"] == 0
    parts = dict(item.strip().split(";dur=") for item in response["Server-Timing"].split(","))
    expected = {"reserve", "sandbox", "service", "settle", "complete", "push", "enqueue", "view", "cpu"}
    assert set(parts) == expected and all(float(ms) >= 0 for ms in parts.values())
    assert float(parts["service"]) <= float(parts["sandbox"]) <= float(parts["view"])
    step = Step.objects.get(trajectory_id=session.trajectory_id, index=0)
    assert step.status == Step.Status.DONE
    assert LiveSession.objects.get(pk=session.pk).observation_settle["redraws"] >= 1  # the typing was waited for
    live.end_live(LiveSession.objects.get(pk=session.pk), "abandoned")
