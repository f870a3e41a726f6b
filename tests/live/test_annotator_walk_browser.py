"""Issue 14's done-when for the annotator (tests/test_roles_walk_browser.py walks the other roles): the think-aloud
flow in real Chromium on the real stack (gunicorn, daphne, a Celery worker, the sandbox service and websockify for
the desktop), a lead's rejection, the fix and the resubmission. It is here, among the tests that start sandboxes,
so that scripts/test runs it one after another with them."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from annotation_app.models import Capture, Role, Trajectory

from ..browsers import chromium_pages
from ..conftest import celery_worker
from ..factories import TaskFactory, UserFactory
from ..servers import web_stack
from ..walks import Walk
from .conftest import needs_desktop

pytestmark = pytest.mark.slow


@needs_desktop
def test_the_annotator_records_submits_sees_the_rejection_fixes_and_resubmits(
    live_settings,
    transactional_db,
    media,
    tmp_path,
    monkeypatch,
):
    """Queue → the think-aloud page → a desktop in the browser → record, act, stop → the timeline → submit; a lead
    rejects it; the queue shows the verdict and comment → fix the thought on the timeline → resubmit."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    UserFactory(username="ann1", role=Role.ANNOTATOR)
    lead_user = UserFactory(username="lead1", role=Role.DATA_LEAD)
    TaskFactory(instruction="Click in the middle of the desktop.", domain="os")
    fake_mic = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
    ports = {"http_port": live_settings.web_port, "ws_port": live_settings.ws_port}
    with (
        celery_worker(tmp_path / "worker.log", **live_settings.env()) as worker,
        web_stack(tmp_path, **ports, **live_settings.env()) as base,
        chromium_pages(base, fake_mic) as new_page,
    ):
        annotator = Walk(new_page(), tmp_path, "ann1")
        page = annotator.page
        expect(page.locator("h1")).to_have_text("My queue")
        page.click("text=Get next task")
        expect(page.locator("#current-task .instruction")).to_have_text("Click in the middle of the desktop.")
        annotator.shot("queue")
        page.click("nav >> text=Think-aloud")
        page.click("text=Record my current task in the browser")
        expect(page).to_have_url(re.compile(r"/insitu/\d+/$"))
        capture_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        expect(page.locator("#browser-capture")).to_have_attribute("data-vnc", "connected", timeout=90_000)
        page.click("#record")
        page.wait_for_function("window.thinkAloud.state === 'recording'", timeout=30_000)
        box = page.locator("#vnc canvas").bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.keyboard.type("ok")
        annotator.shot("recording")
        page.click("#stop")
        capture = wait_for_capture(capture_id, worker)
        expect(page.locator("textarea.thought").first).to_be_visible(timeout=30_000)
        page.locator("textarea.thought").first.fill("I click the middle of the desktop.")
        page.locator("textarea.thought").first.blur()
        expect(page.locator(".save-state").first).to_have_text("saved", timeout=30_000)
        annotator.shot("timeline")
        page.click("#submit-capture")
        if page.locator("#submit-warning").is_visible():  # some thoughts are empty (what the beeps were heard as)
            page.click("#submit-anyway")
        expect(page.locator("#capture-status")).to_contain_text("Submitted", timeout=30_000)
        trajectory_id = Capture.objects.get(pk=capture_id).trajectory_id

        # a data lead rejects it, in a browser of their own
        lead = Walk(new_page(), tmp_path, "lead1")
        lead.page.click(f"a[href='/trajectories/{trajectory_id}/']")
        lead.page.check("input[name=verdict][value=reject]")
        lead.page.fill("textarea[name=comment]", "Say why you click there.")
        lead.page.click("text=Save review")
        expect(lead.page.locator("h1 .pill")).to_have_text("Rejected")

        # the annotator sees it on the queue, fixes the thought on the timeline and resubmits
        page.goto("/annotate/")
        expect(page.locator("main")).to_contain_text("Say why you click there.")
        expect(page.locator("main")).to_contain_text("Rejected")
        annotator.shot("queue-rejected")
        page.click("text=Fix and resubmit")
        expect(page.locator("#fix-rejected")).to_contain_text("Say why you click there.")
        page.click("#fix-on-timeline")
        expect(page.locator("#fix-hint")).to_be_visible()
        area = page.locator("textarea.thought").first
        area.fill("The task says the middle, so I click the middle of the desktop.")
        area.blur()
        expect(page.locator(".save-state").first).to_have_text("saved", timeout=30_000)
        expect(page.locator("#trajectory-status")).to_have_text("Rejected")
        page.click("#submit-capture")
        if page.locator("#submit-warning").is_visible():
            page.click("#submit-anyway")
        # the page reloads once it is resubmitted (the capture itself said "Submitted" all along)
        expect(page.locator("#trajectory-status")).to_have_text("Submitted", timeout=30_000)
        expect(page.locator("#fix-hint")).to_have_count(0)
        annotator.shot("resubmitted")
        page.goto("/annotate/")
        page.click("text=Get next task")
        expect(page.locator("#current-task")).to_contain_text("No pending tasks are left")
        annotator.answers.only()
        lead.answers.only()

    trajectory = Trajectory.objects.get(pk=trajectory_id)
    assert trajectory.status == Trajectory.Status.SUBMITTED and capture.source == "browser"
    assert list(trajectory.reviews.values_list("verdict", "reviewer")) == [("reject", lead_user.pk)]
    assert trajectory.steps.get(index=0).thought.startswith("The task says the middle")
    assert trajectory.metadata["thoughts_before_fix"] == {"0": "I click the middle of the desktop."}


def wait_for_capture(capture_id: int, worker: Path, timeout: float = 240) -> Capture:
    """The capture once the worker has processed it (ready), or a failure with the reason and the worker's log."""
    deadline = time.monotonic() + timeout
    while (capture := Capture.objects.get(pk=capture_id)).status not in ("ready", "failed"):
        assert time.monotonic() < deadline, f"capture still {capture.status} ({capture.stage})"
        time.sleep(0.5)
    assert capture.status == "ready", (capture.error, worker.read_text()[-2000:])
    return capture
