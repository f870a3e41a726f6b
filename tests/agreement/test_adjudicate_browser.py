"""A data lead adjudicates a disagreement in real Chromium: two annotators took a k=2 task from the queue and
submitted different trajectories; the lead finds it on the agreement page, compares the two side by side, is told
to pick one when they pick nothing, then keeps one and sees the other rejected."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from annotation_app import task_queue, trajectories
from annotation_app.models import Adjudication, Role, Task, Trajectory

from ..browsers import chromium_pages, log_in
from ..factories import StepFactory, TaskFactory, UserFactory
from ..servers import web_stack

pytestmark = pytest.mark.slow


def _annotate(user, actions: list[str], outcome: float) -> Trajectory:
    """Take the queue's next task, record `actions` and submit, as the annotation pages do."""
    task = task_queue.next_task(user).task
    trajectory = trajectories.start_trajectory(user, task, Trajectory.Mode.INTERACTIVE)
    for i, text in enumerate(actions):
        StepFactory(trajectory=trajectory, index=i, action_text=text, action=trajectories.typed_action(text))
    Trajectory.objects.filter(pk=trajectory.pk).update(outcome_reward=outcome)
    return trajectories.submit(trajectory)


def test_a_lead_adjudicates_a_disagreement(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    ann1, ann2 = UserFactory(username="ann1"), UserFactory(username="ann2")
    task = TaskFactory(instruction="Save the sheet as report.ods.", required_annotations=2)
    kept = _annotate(ann1, ["click(start_box='(120,40)')", "hotkey(key='ctrl s')"], 1.0)
    task.refresh_from_db()
    assert task.status == Task.Status.PENDING  # one of two
    other = _annotate(ann2, ["click(start_box='(900,600)')", "hotkey(key='ctrl s')", "wait()"], 0.0)
    task.refresh_from_db()
    assert task.status == Task.Status.COMPLETED  # k = 2 submitted

    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        page = new_page()
        log_in(page, "lead1")
        page.click("nav >> text=Agreement")
        row = page.locator(f"#disagreements tr[data-task='{task.pk}']")
        expect(row).to_contain_text("ann1, ann2")
        row.locator("text=Adjudicate").click()
        expect(page).to_have_url(re.compile(rf"/lead/tasks/{task.pk}/adjudicate/$"))
        table = page.locator("table.side")
        expect(table.locator("thead th")).to_have_count(3)  # the step column and one per annotation
        expect(table.locator("tr[data-index='0'] td.differs")).to_have_count(2)  # the first clicks differ
        expect(table.locator("tr[data-index='1']")).to_have_class("same")  # both saved with ctrl s
        expect(table.locator("tr[data-index='2'] td").nth(0)).to_have_text("—")  # ann1 had no third step
        page.click("#adjudicate-form button[type=submit]")
        expect(page.locator("#page-error")).to_contain_text("Pick the trajectory that stands")
        page.check(f"input[name=chosen][value='{kept.pk}']")
        page.fill("textarea[name=note]", "ann1 used the File menu.")
        page.screenshot(path=tmp_path / "adjudicate.png", full_page=True)
        page.click("#adjudicate-form button[type=submit]")
        expect(page.locator("#decision")).to_contain_text(f"trajectory #{kept.pk} stands")
        expect(page.locator("table.side thead th").nth(2).locator(".pill")).to_have_text("Rejected")

    other.refresh_from_db()
    kept.refresh_from_db()
    assert (kept.status, other.status) == (Trajectory.Status.SUBMITTED, Trajectory.Status.REJECTED)
    assert Adjudication.objects.get(task=task).chosen_id == kept.pk
