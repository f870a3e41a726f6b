"""Think-aloud in the browser, end to end in real Chromium with a fake microphone fed from a WAV file: a real Celery
worker leases and sets up the sandbox desktop while the page waits; the annotator drives it over VNC while
MediaRecorder records; the sandbox captures the input events; the worker transcribes and aligns; the timeline shows
the spoken words."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import soundfile
from playwright.sync_api import expect

from annotation_app.insitu import browser
from annotation_app.insitu.audio import SAMPLE_RATE
from annotation_app.models import Capture, Role
from annotation_app.task_queue import next_task
from sandbox.client import SessionGoneError

from ..browsers import chromium_pages, log_in
from ..conftest import celery_worker
from ..factories import TaskFactory, UserFactory
from ..insitu.captures import SCRIPT_WER, speech, wer
from ..servers import web_stack
from .conftest import needs_desktop

pytestmark = [needs_desktop, pytest.mark.slow]

CLICKS = ((0.25, 0.25), (0.5, 0.5), (0.75, 0.75))  # where on the desktop, as fractions of its width and height
SENTENCE = "I am clicking in the middle of the desktop"  # what the fake microphone says before the clicks
SETUP_S = 3  # a task setup this slow used to hold the request (and a gunicorn worker); now the page shows it


@pytest.fixture
def capture_worker(transactional_db, live_settings, tmp_path):
    """A worker on every queue that talks to this stack's sandbox service: it starts the capture's desktop (`live`
    queue) and processes the capture (`asr`)."""
    with celery_worker(tmp_path / "worker.log", **live_settings.env()) as log:
        yield log


@pytest.fixture
def spoken_wav(tmp_path):
    """What the fake microphone plays (Chromium loops it): a sentence, then silence."""
    voice = speech(SENTENCE, tmp_path)
    track = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), voice, np.zeros(SAMPLE_RATE * 6, np.float32)])
    path = tmp_path / "mic.wav"
    soundfile.write(path, track, SAMPLE_RATE)
    return path


def test_a_think_aloud_session_in_the_browser(live_settings, capture_worker, spoken_wav, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    worker = capture_worker
    annotator = UserFactory(username="aloud1", role=Role.ANNOTATOR)
    setup = [{"type": "sleep", "parameters": {"seconds": SETUP_S}}]
    TaskFactory(instruction="Click in the middle of the desktop.", setup_config=setup)
    next_task(annotator)
    fake_mic = (
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={spoken_wav}",
    )
    ports = {"http_port": live_settings.web_port, "ws_port": live_settings.ws_port}
    with web_stack(tmp_path, **ports, **live_settings.env()) as base, chromium_pages(base, fake_mic) as new_page:
        page = new_page()
        log_in(page, "aloud1")
        page.goto("/insitu/")
        clicked = time.monotonic()
        page.click("text=Record my current task in the browser")
        expect(page).to_have_url(re.compile(r"/insitu/\d+/$"))
        capture_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        # the page is there before the desktop: it says so, and Record waits for it
        assert time.monotonic() - clicked < SETUP_S
        expect(page.locator("#desktop-starting")).to_contain_text("starting the desktop")
        expect(page.locator("#record")).to_be_disabled()
        assert page.locator("#browser-capture").get_attribute("data-vnc") is None
        # the worker finishes the setup; the status poll reloads the page, which connects to the desktop
        expect(page.locator("#browser-capture")).to_have_attribute("data-vnc", "connected", timeout=60_000)
        expect(page.locator("#record")).to_be_enabled()
        capture = Capture.objects.get(pk=capture_id)
        assert (capture.stage, capture.status) == ("ready to record", "recording") and capture.meta["sandbox_session"]
        page.click("#record")
        page.wait_for_function("window.thinkAloud.state === 'recording'", timeout=30_000)
        time.sleep(4.0)  # the sentence plays before the clicks
        # Where the desktop is now: Record scrolls its controls to the top of the window with the desktop under them,
        # so a box measured before is stale, and a click outside the viewport reaches nothing (not the page, not VNC).
        box = page.locator("#vnc canvas").bounding_box()
        viewport = page.viewport_size
        # ... and Stop stays in sight: the desktop is sized to fit the window under the Record/Stop line
        stop = page.locator("#stop").bounding_box()
        assert 0 <= stop["y"] and stop["y"] + stop["height"] <= viewport["height"], (stop, viewport)
        assert box["y"] + box["height"] <= viewport["height"], (box, viewport)
        for fx, fy in CLICKS:
            x, y = box["x"] + box["width"] * fx, box["y"] + box["height"] * fy
            assert 0 <= x < viewport["width"] and 0 <= y < viewport["height"], (box, viewport)
            page.mouse.click(x, y)
            time.sleep(0.3)
        page.keyboard.type("hi")
        page.click("#stop")  # at once: the keys typed just before stop are captured too
        deadline = time.monotonic() + 180
        while (capture := Capture.objects.get(pk=capture_id)).status not in ("ready", "failed"):
            assert time.monotonic() < deadline, f"capture still {capture.status} ({capture.stage})"
            time.sleep(0.5)
        assert capture.status == "ready", (capture.error, worker.read_text()[-2000:])
        # the page reloads itself once processing is over (its status poll answers HX-Refresh): a reload from here
        # too would race with that one and abort
        expect(page.locator(".word").first).to_be_visible(timeout=30_000)
        expect(page.locator("#capture-audio")).to_be_visible()

    steps = list(capture.trajectory.steps.order_by("index"))
    names = [s.action_text.split("(")[0] for s in steps]
    assert names == ["click", "click", "click", "type", "finished"], (capture.warnings, _events(capture))
    assert capture.source == "browser" and capture.meta["platform"] == "sandbox"
    assert capture.meta["audio"]["file"] == "audio.webm"
    assert wer(SENTENCE, steps[0].thought) <= SCRIPT_WER, steps[0].thought  # as tiny.en hears it on this CPU
    # every click landed where it was made on the 1280×800 desktop (noVNC scales the canvas: a pixel or two off)
    for step, (fx, fy) in zip(steps[:3], CLICKS, strict=True):
        x, y = step.action["actions"][0]["point"]
        assert abs(x - 1280 * fx) <= 3 and abs(y - 800 * fy) <= 3, (step.action_text, fx, fy)
    assert steps[3].action_text == "type(content='hi')", steps[3].action_text


def test_a_failed_setup_releases_the_desktop_and_fails_the_capture(live_settings, db):
    """Against the real sandbox service: the desktop is leased, the task's setup fails, the lease is given back."""
    annotator = UserFactory(role=Role.ANNOTATOR)
    TaskFactory(setup_config=[{"type": "no_such_setup", "parameters": {}}])
    next_task(annotator)
    capture = browser.open_browser_capture(annotator)
    browser.start_desktop(capture.pk)
    capture.refresh_from_db()
    assert capture.status == "failed" and capture.stage == "failed"
    assert capture.error.startswith("The sandbox could not be prepared") and "no_such_setup" in capture.error
    session_id = capture.meta["sandbox_session"]  # it was leased, then given back
    with pytest.raises(SessionGoneError):
        browser.sandbox_for(capture).renew(session_id, 60)
    browser.start_desktop(capture.pk)  # a retried delivery of a failed start does nothing
    capture.refresh_from_db()
    assert capture.status == "failed" and capture.meta["sandbox_session"] == session_id


def _events(capture: Capture) -> list[dict]:
    """The capture's input events (for failure messages)."""
    import json
    import tarfile

    from annotation_app.insitu.uploads import archive_file

    with tarfile.open(archive_file(capture)) as tar:
        lines = tar.extractfile("events.jsonl").read().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] not in ("move", "screenshot")]
