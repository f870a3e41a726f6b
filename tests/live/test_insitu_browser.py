"""Think-aloud in the browser, end to end in real Chromium with a fake microphone fed from a WAV file: the annotator
drives a sandbox desktop over VNC while MediaRecorder records; the sandbox captures the input events; a real Celery
worker transcribes and aligns; the timeline shows the spoken words."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import soundfile
from playwright.sync_api import expect

from annotation_app.insitu.audio import SAMPLE_RATE
from annotation_app.models import Capture, Role
from annotation_app.task_queue import next_task

from ..browsers import chromium_pages, log_in
from ..factories import TaskFactory, UserFactory
from ..insitu.captures import speech
from ..servers import web_stack
from .conftest import needs_desktop

pytestmark = [needs_desktop, pytest.mark.slow]

CLICKS = ((0.25, 0.25), (0.5, 0.5), (0.75, 0.75))  # where on the desktop, as fractions of its width and height


@pytest.fixture
def spoken_wav(tmp_path):
    """What the fake microphone plays (Chromium loops it): a sentence, then silence."""
    voice = speech("I am clicking in the middle of the desktop", tmp_path)
    track = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.float32), voice, np.zeros(SAMPLE_RATE * 6, np.float32)])
    path = tmp_path / "mic.wav"
    soundfile.write(path, track, SAMPLE_RATE)
    return path


def test_a_think_aloud_session_in_the_browser(live_settings, worker, spoken_wav, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    annotator = UserFactory(username="aloud1", role=Role.ANNOTATOR)
    TaskFactory(instruction="Click in the middle of the desktop.")
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
        page.click("text=Record my current task in the browser")
        expect(page).to_have_url(re.compile(r"/insitu/\d+/$"))
        capture_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        expect(page.locator("#browser-capture")).to_have_attribute("data-vnc", "connected", timeout=60_000)
        page.click("#record")
        page.wait_for_function("window.thinkAloud.state === 'recording'", timeout=30_000)
        time.sleep(4.0)  # the sentence plays before the clicks
        # Where the desktop is now: focusing it when recording starts scrolls it into view, so a box measured before
        # is stale, and a click outside the viewport reaches nothing (not the page, not VNC).
        box = page.locator("#vnc canvas").bounding_box()
        viewport = page.viewport_size
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
    assert "clicking" in steps[0].thought.lower() and "middle" in steps[0].thought.lower(), steps[0].thought
    # every click landed where it was made on the 1280×800 desktop (noVNC scales the canvas: a pixel or two off)
    for step, (fx, fy) in zip(steps[:3], CLICKS, strict=True):
        x, y = step.action["actions"][0]["point"]
        assert abs(x - 1280 * fx) <= 3 and abs(y - 800 * fy) <= 3, (step.action_text, fx, fy)
    assert steps[3].action_text == "type(content='hi')", steps[3].action_text


def _events(capture: Capture) -> list[dict]:
    """The capture's input events (for failure messages)."""
    import json
    import tarfile

    from annotation_app.insitu.uploads import archive_file

    with tarfile.open(archive_file(capture)) as tar:
        lines = tar.extractfile("events.jsonl").read().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] not in ("move", "screenshot")]
