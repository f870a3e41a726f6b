"""One data lead's review in real Chromium: open the queue, take the next trajectory, score the rubric, see the error
for a score out of range, then reject with a reason and send the task back to the pool."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from annotation_app.models import Review, ReviewAssignment, Role, Task, Trajectory
from tests.browsers import chromium_pages, log_in
from tests.factories import TaskFactory, TrajectoryFactory, UserFactory
from tests.servers import free_port, web_stack

pytestmark = pytest.mark.slow


@pytest.fixture
def browser_page(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    with web_stack(tmp_path, SANDBOX_URL=f"http://127.0.0.1:{free_port()}") as base, chromium_pages(base) as new_page:
        yield new_page


def test_lead_takes_next_scores_and_rejects_with_send_back(browser_page):
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    task = TaskFactory(status=Task.Status.COMPLETED, instruction="Sum column B in the sheet.")
    trajectory = TrajectoryFactory(task=task, annotator=annotator, status=Trajectory.Status.SUBMITTED)
    Trajectory.objects.filter(pk=trajectory.pk).update(submitted_at=trajectory.created_at)

    page = browser_page()
    log_in(page, "lead1")
    page.wait_for_url(re.compile(r"/lead/$"))
    page.click("nav >> text=Review")
    expect(page.locator("#review-queue-table")).to_contain_text(f"#{trajectory.pk}")
    expect(page.locator("#review-queue-table")).to_contain_text("New annotator")

    page.click("#review-next")
    expect(page.locator("#review-current > h2")).to_contain_text(f"#{trajectory.pk}")
    panel = page.locator("#verdict-panel")
    expect(panel.locator("input[name=score-task_completed]")).to_be_visible()
    panel.locator("input[name=score-task_completed]").fill("7")
    panel.locator("input[name=score-efficient]").fill("2")
    panel.locator("input[name=score-thoughts_explain_actions]").fill("3")
    panel.locator("input[name=verdict][value=reject]").check()
    panel.locator("select[name=reason]").select_option("task_not_done")
    panel.locator("input[name=send_back]").check()
    panel.locator("textarea[name=comment]").fill("The sum is in the wrong cell.")
    panel.locator("#verdict-submit").click()
    expect(page.locator("#verdict-errors")).to_contain_text("7 is out of range; give 1 to 5")
    assert not Review.objects.exists()

    panel = page.locator("#verdict-panel")  # swapped in with the values kept
    expect(panel.locator("input[name=score-efficient]")).to_have_value("2")
    panel.locator("input[name=score-task_completed]").fill("1")
    panel.locator("#verdict-submit").click()
    expect(page.locator("#verdict-saved")).to_contain_text(f"task #{task.pk} is back in the pool")

    review = Review.objects.get()
    assert review.scores == {"task_completed": 1, "efficient": 2, "thoughts_explain_actions": 3}
    assert review.verdict == Review.Verdict.REJECT and "wrong cell" in review.comment
    task.refresh_from_db()
    trajectory.refresh_from_db()
    assert task.status == Task.Status.PENDING and trajectory.status == Trajectory.Status.REJECTED
    assert ReviewAssignment.objects.get().status == ReviewAssignment.Status.DONE

    page.click("#verdict-next")
    expect(page.locator("main")).to_contain_text("No trajectories are waiting for review")
