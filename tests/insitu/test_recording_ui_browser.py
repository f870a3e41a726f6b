"""The browser think-aloud page's recording controls in real Chromium with a fake microphone, on the real stack
(sandbox service, websockify, a Celery worker, gunicorn and daphne): a full quota refuses the start and Record with
the reason on the page; the timer runs and the level meter hears the microphone; Pause silences the audio without
cutting it (the words after a pause stay aligned with the events) and freezes the desktop; submitting with an empty
thought asks again instead of blocking."""

from __future__ import annotations

import re
import tarfile
import time
import uuid

import pytest
from playwright.sync_api import expect

from annotation_app.insitu.audio import SAMPLE_RATE, load_audio
from annotation_app.insitu.uploads import archive_file
from annotation_app.models import Capture, Role, Trajectory
from annotation_app.task_queue import next_task

from ..browsers import chromium_pages, log_in
from ..conftest import celery_worker
from ..factories import TaskFactory, UserFactory
from ..live.conftest import live_services, live_settings, needs_desktop, policy_url, tiny_checkpoint  # noqa: F401
from ..servers import web_stack

pytestmark = [needs_desktop, pytest.mark.slow]

QUOTA = 1_000_000
PAUSE_S = 3.0  # long enough that an audio file cut at the pause would end well before the last click


@pytest.fixture
def capture_worker(transactional_db, live_settings, tmp_path):  # noqa: F811
    with celery_worker(tmp_path / "worker.log", **live_settings.env()) as log:
        yield log


def _capture_time(page) -> float:
    """The capture clock now, as the page computes it from its audio offset."""
    return page.evaluate("window.thinkAloud.captureTime()")


def test_recording_controls_quota_pause_and_the_submit_warning(live_settings, capture_worker, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    annotator = UserFactory(username="aloud-ui", role=Role.ANNOTATOR)
    TaskFactory(instruction="Click twice on the desktop.")
    next_task(annotator)
    full = Capture.objects.create(annotator=annotator, session_id=uuid.uuid4(), size=QUOTA, sha256="0" * 64)
    fake_mic = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
    ports = {"http_port": live_settings.web_port, "ws_port": live_settings.ws_port}
    env = {**live_settings.env(), "MAX_USER_CAPTURE_BYTES": str(QUOTA)}
    with web_stack(tmp_path, **ports, **env) as base, chromium_pages(base, fake_mic) as new_page:
        page = new_page()
        log_in(page, "aloud-ui")
        page.goto("/insitu/")
        # 1. a full quota: the start is refused on the page (413), and no desktop is leased
        with page.expect_response(re.compile(r"/insitu/browser/$")) as refused:
            page.click("text=Record my current task in the browser")
        assert refused.value.status == 413
        expect(page.locator("#start-error")).to_contain_text("fill your quota")
        assert not Capture.objects.filter(source=Capture.Source.BROWSER).exists()
        full.delete()
        page.click("text=Record my current task in the browser")
        expect(page).to_have_url(re.compile(r"/insitu/\d+/$"))
        capture_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        expect(page.locator("#browser-capture")).to_have_attribute("data-vnc", "connected", timeout=90_000)
        # 2. the quota filled meanwhile (another upload): Record is refused too, and the page says why
        full = Capture.objects.create(annotator=annotator, session_id=uuid.uuid4(), size=QUOTA, sha256="0" * 64)
        page.click("#record")
        expect(page.locator("#capture-state")).to_contain_text("could not start: Your captures fill your quota")
        expect(page.locator("#record")).to_be_enabled()
        full.delete()
        # 3. recording: the timer runs and the meter hears the fake microphone (it beeps)
        page.click("#record")
        page.wait_for_function("window.thinkAloud.state === 'recording'", timeout=30_000)
        expect(page.locator("#recording-meters")).to_be_visible()
        expect(page.locator("#rec-timer")).not_to_have_text("0:00", timeout=10_000)
        page.wait_for_function("window.thinkAloud.peak > 0.01", timeout=20_000)
        canvas = page.locator("#vnc canvas")
        box = canvas.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.3)
        # 4. paused: the meter is silent, the desktop frozen (a click there is no action), the timer counts it
        page.click("#pause")
        page.wait_for_function("window.thinkAloud.state === 'paused'")
        expect(page.locator("#vnc")).to_have_class(re.compile(r"\bpaused\b"))
        expect(page.locator("#pause")).to_have_text("Resume")
        page.wait_for_function("window.thinkAloud.level === 0", timeout=5_000)
        page.mouse.click(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.6)
        time.sleep(PAUSE_S)  # a pause of some length (what is asserted is the audio's length, below)
        expect(page.locator("#rec-timer")).to_contain_text("paused")
        page.click("#pause")
        page.wait_for_function("window.thinkAloud.state === 'recording'")
        page.wait_for_function("window.thinkAloud.level > 0", timeout=20_000)  # the microphone is heard again
        box = canvas.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.7, box["y"] + box["height"] * 0.7)
        last_click = _capture_time(page)
        pauses = page.evaluate("window.thinkAloud.pauses")
        page.screenshot(path=tmp_path / "recording.png")
        page.click("#stop")
        deadline = time.monotonic() + 240
        while (capture := Capture.objects.get(pk=capture_id)).status not in ("ready", "failed"):
            assert time.monotonic() < deadline, f"capture still {capture.status} ({capture.stage})"
            time.sleep(0.5)
        assert capture.status == "ready", (capture.error, capture_worker.read_text()[-2000:])
        # 5. the timeline: submitting with an empty thought warns and asks again; it does not block
        expect(page.locator("textarea.thought").first).to_be_visible(timeout=30_000)
        areas = page.locator("textarea.thought")
        for i in range(areas.count()):
            areas.nth(i).fill(f"Thought {i}." if i else "")
        areas.nth(0).blur()
        page.click("#submit-capture")
        expect(page.locator("#submit-warning")).to_be_visible()
        expect(page.locator("#submit-warning-list")).to_contain_text("1 of 3 steps has an empty thought")
        page.screenshot(path=tmp_path / "submit-warning.png", full_page=True)
        page.click("#keep-editing")
        expect(page.locator("#submit-warning")).to_be_hidden()
        assert Capture.objects.get(pk=capture_id).status == "ready"
        page.click("#submit-capture")
        page.click("#submit-anyway")
        expect(page.locator("#capture-status")).to_contain_text("Submitted", timeout=30_000)

    capture = Capture.objects.get(pk=capture_id)
    assert capture.trajectory.status == Trajectory.Status.SUBMITTED
    # the click made while paused is not an action: the desktop was view-only
    names = [s.action_text.split("(")[0] for s in capture.trajectory.steps.order_by("index")]
    assert names == ["click", "click", "finished"], names
    # the audio runs through the pause: it lasts until the last click on the capture clock (a file cut at the pause
    # would end PAUSE_S earlier)
    assert len(pauses) == 1 and pauses[0]["end"] - pauses[0]["start"] >= PAUSE_S
    offset = capture.meta["audio"]["offset"]
    with tarfile.open(archive_file(capture)) as archive:
        audio = archive.extractfile(capture.meta["audio"]["file"]).read()
    seconds = len(load_audio(audio)) / SAMPLE_RATE
    assert offset + seconds >= last_click - 0.5, (offset, seconds, last_click, pauses)
