"""Every form shows its 4xx errors in real Chromium: the htmx forms (import, queue), the review form, the timeline
and the live override. htmx drops 4xx answers by default, which left the lead's import result blank."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import Page, Route, expect

from annotation_app.models import Capture, LiveSession, Role, Task, Trajectory

from .browsers import chromium_pages, log_in
from .factories import StepFactory, TaskFactory, TrajectoryFactory, UserFactory
from .servers import free_port, web_stack

pytestmark = pytest.mark.slow


@pytest.fixture
def browser_page(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    # No sandbox service answers here (the live page's lease renewal and VNC token fail as "unreachable").
    with web_stack(tmp_path, SANDBOX_URL=f"http://127.0.0.1:{free_port()}") as base, chromium_pages(base) as new_page:
        yield new_page


def sign_in(page: Page, username: str) -> None:
    """Log in and wait for the landing page (a goto right after the submit would cancel the login)."""
    log_in(page, username)
    page.wait_for_url(re.compile(r"/(lead|annotate|flywheel)/$"))


def upload(page: Page, name: str, content: bytes) -> None:
    page.set_input_files("input[name=file]", {"name": name, "mimeType": "application/json", "buffer": content})
    page.click("button:text-is('Import')")


def test_import_errors_show_on_the_lead_page(browser_page):
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    page = browser_page()
    sign_in(page, "lead1")
    result = page.locator("#import-result")

    upload(page, "cut.json", b'[{"instruction": "Open the ')
    expect(result).to_contain_text("Nothing was imported: 1 problem")
    expect(result).to_contain_text("invalid JSON")

    upload(page, "t.json", b'[{"id": "t-1", "instruction": "Open the calculator."}]')
    expect(result).to_contain_text("Imported 1 task")
    upload(page, "t.json", b'[{"id": "t-1", "instruction": "Open the calculator."}]')  # the same file twice
    expect(result).to_contain_text("a task with id 't-1' already exists")

    bad_lines = b'{"instruction": "Fine."}\n{"instruction": "Go.", "difficulty": 9}\n'
    bad_lines += b'{"instruction": "Jump.", "config": [{"type": "teleport", "parameters": {}}]}\n'
    upload(page, "t.jsonl", bad_lines)
    expect(result.locator("tbody tr")).to_have_count(2)
    expect(result).to_contain_text("difficulty")
    expect(result).to_contain_text("unknown setup type 'teleport'")
    assert Task.objects.count() == 1


def test_a_refused_queue_request_shows_why(browser_page):
    """A whole error page answered to an htmx form shows as its message, in place of the fragment."""
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    TaskFactory()
    page = browser_page()
    sign_in(page, "ann1")
    expect(page.locator("h1")).to_have_text("My queue")
    annotator.role = Role.ML_ENGINEER  # a data lead changes the role while the page is open
    annotator.save(update_fields=["role"])
    page.click("text=Get next task")
    expect(page.locator("#current-task")).to_contain_text("Your role may not annotate.")
    expect(page.locator("#current-task .topbar")).to_have_count(0)  # the message, not a page inside the page


def test_review_errors_show_on_the_trajectory_page(browser_page):
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    page = browser_page()
    sign_in(page, "lead1")
    page.goto(f"/trajectories/{trajectory.pk}/")

    # A verdict is required by the form; a request without one (an old browser, a script) is answered 400.
    page.eval_on_selector_all("input[name=verdict]", "els => els.forEach(e => e.removeAttribute('required'))")
    page.click("text=Save review")
    expect(page.locator("#review-error")).to_contain_text("Choose approve or reject")
    expect(page.locator("h1")).to_contain_text(f"Trajectory #{trajectory.pk}")

    # The trajectory went back to its annotator meanwhile: the review is refused with 409, on the page.
    Trajectory.objects.filter(pk=trajectory.pk).update(status=Trajectory.Status.IN_PROGRESS)
    page.check("input[name=verdict][value=approve]")
    page.click("text=Save review")
    expect(page.locator("#review-error")).to_contain_text("still in progress")
    assert not trajectory.reviews.exists()


def test_timeline_errors_show_next_to_the_thought_and_on_submit(browser_page):
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    trajectory = TrajectoryFactory(annotator=annotator, mode=Trajectory.Mode.IN_SITU)
    StepFactory(trajectory=trajectory, index=0, action={"actions": []})
    capture = Capture.objects.create(
        annotator=annotator,
        session_id=uuid.uuid4(),
        size=1,
        sha256="0" * 64,
        status=Capture.Status.READY,
        trajectory=trajectory,
        meta={"screen": {"width": 640, "height": 400}},
    )
    page = browser_page()
    sign_in(page, "ann1")
    page.goto(f"/insitu/{capture.pk}/")
    page.fill("textarea.thought", "x" * 5001)
    page.locator("textarea.thought").blur()
    expect(page.locator(".save-state")).to_contain_text(
        "not saved: The request has invalid fields. thought: Ensure this field has no more than 5000 characters."
    )

    Trajectory.objects.filter(pk=trajectory.pk).update(status=Trajectory.Status.SUBMITTED)  # from another tab
    page.click("#submit-capture")  # the refusal shows on the page, beside the button (it was an alert box)
    expect(page.locator("#submit-error")).to_have_text("Not submitted: This trajectory was already submitted.")


def test_a_thought_typed_before_the_timeline_script_ran_is_saved(browser_page):
    """The timeline's script is a module, run after the page shows: a thought typed before it ran (no listener yet)
    is saved when it runs, not lost without a word. Held back here so the typing surely comes first."""
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    trajectory = TrajectoryFactory(annotator=annotator, mode=Trajectory.Mode.IN_SITU)
    step = StepFactory(trajectory=trajectory, index=0, action={"actions": []}, thought="")
    capture = Capture.objects.create(
        annotator=annotator, session_id=uuid.uuid4(), size=1, sha256="0" * 64, status=Capture.Status.READY,
        trajectory=trajectory, meta={"screen": {"width": 640, "height": 400}},
    )  # fmt: skip
    page = browser_page()
    sign_in(page, "ann1")
    held: list[Route] = []
    page.route(re.compile(r"/timeline[^/]*\.js"), lambda route: held.append(route))
    page.goto(f"/insitu/{capture.pk}/", wait_until="commit")
    page.fill("textarea.thought", "Typed before the script ran.")
    page.locator("textarea.thought").blur()
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1, "the page did not ask for its timeline script"
    expect(page.locator(".save-state")).to_have_text("")  # nothing listened yet
    held[0].continue_()
    expect(page.locator(".save-state")).to_have_text("saved")
    step.refresh_from_db()
    assert step.thought == "Typed before the script ran."


def test_live_override_errors_show_on_the_live_page(browser_page):
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    trajectory = TrajectoryFactory(annotator=annotator)
    LiveSession.objects.create(
        trajectory=trajectory, status=LiveSession.Status.ACTIVE, model_width=1288, model_height=812
    )
    page = browser_page()
    sign_in(page, "ann1")
    page.goto(f"/live/{trajectory.pk}/")
    page.fill("#override-action", "click(start_box='<|box_start|>(10,20)<|box_end|>')")
    expect(page.locator("#override-check")).to_have_class("check ok")
    page.fill("#override-thought", "y" * 5001)  # over the step's 5,000-character limit: answered 400
    page.click("#override-run")
    expect(page.locator("#live-error")).to_contain_text(
        "The request has invalid fields. thought: Ensure this field has no more than 5000 characters."
    )
    assert not trajectory.steps.exists()
