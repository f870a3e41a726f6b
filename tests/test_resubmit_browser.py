"""Fixing a rejected live trajectory in real Chromium: from the queue's "Fix and resubmit" to the form on the
trajectory page, a refusal shown on the page, the resubmission, and a new attempt at the task from the queue."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from annotation_app import trajectories
from annotation_app.models import Assignment, Review, Role, Task, Trajectory

from .browsers import chromium_pages, log_in
from .factories import StepFactory, TaskFactory, TrajectoryFactory, UserFactory
from .servers import web_stack

pytestmark = pytest.mark.slow


def test_an_annotator_fixes_resubmits_and_attempts_again(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    lead = UserFactory(username="lead1", role=Role.DATA_LEAD)
    task = TaskFactory(instruction="Open the settings.", status=Task.Status.COMPLETED)
    Assignment.objects.create(task=task, annotator=annotator, status=Assignment.Status.COMPLETED)
    trajectory = TrajectoryFactory(task=task, annotator=annotator, status=Trajectory.Status.SUBMITTED)
    StepFactory(trajectory=trajectory, index=0, thought="", action_text="click(start_box='(10,20)')")
    trajectories.review(trajectory, lead, Review.Verdict.REJECT, comment="Step 0 needs a thought.")

    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        page = new_page()
        log_in(page, "ann1")
        expect(page.locator("h1")).to_have_text("My queue")
        page.click("text=Fix and resubmit")
        expect(page).to_have_url(re.compile(rf"/trajectories/{trajectory.pk}/#fix-rejected$"))
        form = page.locator("#fix-form")
        expect(page.locator("#fix-rejected")).to_contain_text("Step 0 needs a thought.")
        # too long a thought: refused on the page (400), nothing saved
        form.locator("textarea[name=thought-0]").evaluate("el => el.removeAttribute('maxlength')")
        form.locator("textarea[name=thought-0]").fill("x" * 5001)
        page.click("#resubmit")
        expect(page.locator("#fix-error")).to_contain_text("A thought is at most 5,000 characters.")
        page.locator("textarea[name=thought-0]").fill("The settings live behind the gear icon, so I click it.")
        page.screenshot(path=tmp_path / "fix-form.png", full_page=True)
        page.click("#resubmit")
        expect(page.locator("main")).to_contain_text("submitted for review again")
        expect(page.locator("h1 .pill")).to_have_text("Submitted")
        expect(page.locator(".thought-before-fix")).to_have_text("Before the fix: (empty)")
        expect(page.locator("#fix-form")).to_have_count(0)
        page.screenshot(path=tmp_path / "resubmitted.png", full_page=True)

        trajectories.review(trajectory, lead, Review.Verdict.REJECT, comment="Try it again from the start.")
        page.goto(f"/trajectories/{trajectory.pk}/")
        page.click("#attempt-again")
        expect(page).to_have_url(re.compile(r"/annotate/$"))
        expect(page.locator("main")).to_contain_text(f"Task #{task.pk} is yours again")
        expect(page.locator("#current-task .instruction")).to_have_text("Open the settings.")

    trajectory.refresh_from_db()
    assert trajectory.status == Trajectory.Status.REJECTED  # the new attempt will be a new trajectory
    assert list(trajectory.reviews.order_by("created_at").values_list("comment", flat=True)) == [
        "Step 0 needs a thought.",
        "Try it again from the start.",
    ]
