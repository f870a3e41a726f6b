"""End to end in real Chromium: open a task live, watch the VNC canvas, accept a proposal, override one, finish."""

from __future__ import annotations

import base64
import re

import pytest
from playwright.sync_api import expect

from annotation_app.live.sessions import ENDING_ACTIONS
from annotation_app.models import LiveSession, Role, Trajectory
from annotation_app.task_queue import next_task

from ..browsers import chromium_pages, log_in
from ..factories import TaskFactory, UserFactory
from .conftest import needs_desktop

pytestmark = [needs_desktop, pytest.mark.slow]


@pytest.fixture
def chromium(live_web, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    with chromium_pages(live_web) as new_page:
        yield new_page


def test_an_annotator_accepts_overrides_and_finishes_in_the_browser(chromium, embedded_model):
    annotator = UserFactory(username="live1", role=Role.ANNOTATOR)
    setup = [{"type": "launch", "parameters": {"command": ["xterm"]}}]
    TaskFactory(instruction="Type hello in a terminal.", setup_config=setup)
    next_task(annotator)

    page = chromium()
    log_in(page, "live1")
    page.click("#annotate-live")
    expect(page).to_have_url(re.compile(r"/live/\d+/$"))
    live = page.locator("#live")
    expect(live).to_have_attribute("data-vnc", "connected", timeout=60_000)
    expect(page.locator("#vnc canvas")).to_be_visible()

    # Proposals arrive over the websocket and are drawn on the screenshot the model saw.
    expect(page.locator("#candidates .candidate")).to_have_count(3, timeout=90_000)
    shown = LiveSession.objects.get(trajectory__annotator=annotator).candidates
    expect(page.locator("#overlay .mark")).to_have_count(sum(len(c["points"]) for c in shown))
    # The first is the model's greedy answer, labelled as its best guess; the others are sampled.
    expect(page.locator("#candidates .best")).to_have_count(1)
    expect(page.locator("#candidates .candidate").first.locator(".best")).to_have_text("best guess")

    # An invalid override is flagged as it is typed and never runs.
    page.fill("#override-action", "click(start_box='(5,5)'")
    expect(page.locator("#override-check")).to_have_class("check bad")
    page.click("#override-run")
    expect(page.locator("#live-error")).to_contain_text("Fix the action first")
    expect(live).to_have_attribute("data-next-index", "0")

    # A click on the screenshot fills the coordinates; then the annotator types their own action.
    page.fill("#override-action", "")
    page.locator("#shot").click(position={"x": 20, "y": 20})
    expect(page.locator("#override-action")).to_have_value(re.compile(r"^click\(start_box="))
    expect(page.locator("#override-check")).to_have_class("check ok")
    page.fill("#override-thought", "Type the greeting.")
    page.fill("#override-action", "type(content='hello')")
    expect(page.locator("#override-check")).to_have_class("check ok")
    page.click("#override-run")
    expect(live).to_have_attribute("data-next-index", "1", timeout=30_000)
    expect(page.locator("#steps li")).to_have_count(1)
    # The new screenshot is shown from the step's answer, byte for byte the stored (settled) observation.
    observation = LiveSession.objects.get(trajectory__annotator=annotator).observation
    expect(page.locator("#shot")).to_have_attribute("data-observation", observation.url)
    shown = page.evaluate("document.getElementById('shot').src")
    assert shown.startswith("data:image/jpeg;base64,")
    with observation.open("rb") as f:
        assert base64.b64decode(shown.split(",", 1)[1]) == f.read()

    # Accept one of the new proposals with its number key. What an untrained model proposes is anyone's guess, so
    # take one that keeps the session going when there is one; an ending one is accepted (and ends it) otherwise.
    expect(page.locator("#candidates .candidate")).to_have_count(3, timeout=90_000)
    codes = page.locator("#candidates .candidate code").all_inner_texts()
    ending = [code.startswith(tuple(ENDING_ACTIONS)) for code in codes]
    choice = ending.index(False) if False in ending else 0
    page.keyboard.press(str(choice + 1))
    if not ending[choice]:
        expect(live).to_have_attribute("data-next-index", "2", timeout=30_000)
        page.fill("#override-action", "finished(content='typed hello')")
        expect(page.locator("#override-check")).to_have_class("check ok")
        page.click("#override-run")
    expect(page.locator("#live-error")).to_have_text("")
    expect(live).to_have_attribute("data-status", "ended", timeout=30_000)

    trajectory = Trajectory.objects.get(annotator=annotator)
    steps = list(trajectory.steps.order_by("index"))
    assert trajectory.status == Trajectory.Status.SUBMITTED and trajectory.mode == Trajectory.Mode.INTERACTIVE
    assert [s.source for s in steps] == ["human", "model"] + ([] if ending[choice] else ["human"])
    assert steps[0].action_text == "type(content='hello')" and steps[0].thought == "Type the greeting."
    assert steps[1].chosen_candidate == choice and len(steps[1].candidates) == 3
    assert all(s.screenshot and s.screenshot_sha256 for s in steps)
    session = LiveSession.objects.get(trajectory=trajectory)
    assert session.end_reason == (ENDING_ACTIONS[codes[choice].split("(")[0]] if ending[choice] else "finished")

    # Another annotator can neither open the page nor get a VNC token.
    UserFactory(username="live2", role=Role.ANNOTATOR)
    other = chromium()
    log_in(other, "live2")
    assert other.goto(f"/live/{trajectory.pk}/").status == 404
