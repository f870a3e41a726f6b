"""Issue 14's done-when: each role walks its flows in real Chromium on the real stack (gunicorn, daphne, a Celery
worker), and every page shows what it should. The annotator's walk, which needs a desktop, is in
tests/live/test_annotator_walk_browser.py.

Every answer of 400 or more that a page gets is collected, and each test names the ones it provoked on purpose (and
checks the page showed them): any other is a failure, so no error goes unshown. Screenshots of each page are kept
under the test's tmp dir. Waits are explicit (Playwright's expect, a worker's result); no sleep is an assertion."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from annotation_app.models import Review, Role, Task, Trajectory
from flywheel.models import DatasetVersion, Iteration

from .browsers import chromium_pages
from .conftest import celery_worker
from .factories import StepFactory, TaskFactory, TrajectoryFactory, UserFactory
from .flywheel.helpers import png, population
from .servers import web_stack
from .walks import Walk

pytestmark = pytest.mark.slow


@pytest.fixture
def browser(transactional_db, media, tmp_path, monkeypatch):
    """gunicorn, daphne and a Celery worker on every queue (all sharing this test's database and media), and a
    factory of signed-in Chromium pages."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    with (
        celery_worker(tmp_path / "worker.log") as log,
        web_stack(tmp_path) as base,
        chromium_pages(base) as new_page,
    ):
        yield lambda username: Walk(new_page(), tmp_path, username), log


def test_the_data_lead_imports_edits_filters_and_reviews(browser):
    walk, _ = browser
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    annotator = UserFactory(username="ann1", role=Role.ANNOTATOR)
    task = TaskFactory(instruction="Sum column B in the sheet.", domain="LibreOffice_Calc", importance=3)
    submitted = [TrajectoryFactory(task=task, annotator=annotator, status=Trajectory.Status.SUBMITTED) for _ in "ab"]
    for t in submitted:
        StepFactory(trajectory=t, index=0, action_text="click(start_box='(10,20)')")
    TrajectoryFactory(task=task, annotator=annotator, status=Trajectory.Status.ABANDONED)

    lead = walk("lead1")
    page = lead.page
    expect(page.locator("h1")).to_have_text("Task pool")
    expect(page.locator("body")).to_have_attribute("data-events-state", "open", timeout=15_000)
    pending = page.locator(".stat", has_text="Pending").locator("b")
    expect(pending).to_have_text("1")

    # a bad file: the errors show, nothing is stored; a good one: the count boxes follow
    result = page.locator("#import-result")
    upload(page, "cut.json", b'[{"instruction": "Open the ')
    expect(result).to_contain_text("Nothing was imported: 1 problem")
    upload(page, "bad.jsonl", b'{"instruction": "Go.", "difficulty": 9}\n{"instruction": "x", "config": 3}\n')
    expect(result.locator("tbody tr")).to_have_count(2)
    expect(result).to_contain_text("difficulty")
    lead.shot("lead-import-errors")
    upload(page, "good.jsonl", b'{"instruction": "Rename a.txt to b.txt."}\n{"instruction": "Empty the trash."}\n')
    expect(result).to_contain_text("Imported 2 tasks")
    expect(pending).to_have_text("3", timeout=15_000)
    assert Task.objects.count() == 3

    # the domain filter matches any case and part of the name
    page.locator("input[name=domain]").press_sequentially("calc")  # filters as the lead types
    expect(page).to_have_url(re.compile(r"domain=calc"), timeout=15_000)  # the last keystroke's filter has answered
    expect(page.locator("#task-table tbody tr")).to_have_count(1)
    expect(page.locator("#task-table")).to_contain_text("Sum column B")
    lead.shot("lead-pool-filtered")

    # the task's page: edit, archive, requeue (a page load, which takes seconds on a loaded machine)
    page.click(f"#task-table a[href='/lead/tasks/{task.pk}/']")
    page.wait_for_url(f"**/lead/tasks/{task.pk}/", timeout=30_000)
    expect(page.locator("h1")).to_contain_text(f"Task #{task.pk}")
    expect(page.locator("main")).to_contain_text("No evaluator")
    page.fill("textarea[name=instruction]", "Sum column B of the sheet into B10.")
    page.click("button:text-is('Save')")
    expect(page.locator("textarea[name=instruction]")).to_have_value("Sum column B of the sheet into B10.")
    page.click("button:text-is('Archive')")
    expect(page.locator("h1 .pill")).to_have_text("Archived")
    page.click("button:text-is('Requeue (pending)')")
    expect(page.locator("h1 .pill")).to_have_text("Pending")
    expect(page.locator("main")).to_contain_text("Abandoned")  # its trajectories, the abandoned one too
    lead.shot("lead-task")

    # every trajectory, filtered (a bad filter says why)
    page.goto("/lead/trajectories/")
    table = page.locator("#trajectory-table tbody tr")
    expect(table).to_have_count(3)
    page.select_option("select[name=status]", "abandoned")
    expect(table).to_have_count(1)
    expect(table).to_contain_text("Abandoned")
    page.select_option("select[name=status]", "")
    task_filter = page.locator("input[name=task]")
    task_filter.press_sequentially("abc")  # the table follows the typing
    expect(page.locator("#trajectory-table")).to_contain_text("The task filter takes a task number.")
    task_filter.fill("")
    task_filter.press_sequentially(str(task.pk))
    expect(table).to_have_count(3)
    lead.shot("lead-trajectories")

    # review: reject one with a comment, approve the other; the pool's review list empties
    page.goto(f"/trajectories/{submitted[0].pk}/")
    page.check("input[name=verdict][value=reject]")
    page.select_option("select[name=score]", "2")
    page.fill("textarea[name=comment]", "The click misses the cell.")
    page.click("text=Save review")
    expect(page.locator("h1 .pill")).to_have_text("Rejected")
    expect(page.locator("#reviews")).to_contain_text("The click misses the cell.")
    lead.shot("lead-review")
    page.goto(f"/trajectories/{submitted[1].pk}/")
    page.check("input[name=verdict][value=approve]")
    page.click("text=Save review")
    expect(page.locator("h1 .pill")).to_have_text("Approved")
    page.goto("/lead/")
    expect(page.locator("main")).to_contain_text("Nothing to review.")
    assert sorted(Review.objects.values_list("verdict", flat=True)) == ["approve", "reject"]
    lead.answers.only((400, r"/lead/import/$"), (400, r"/lead/trajectories/\?"))


def test_the_ml_engineer_runs_an_iteration_and_downloads_its_store(browser, make_user):
    walk, worker = browser
    UserFactory(username="eng1", role=Role.ML_ENGINEER)
    population(random.Random(7), 12, screenshots=png(640, 400), reviewer=make_user("data_lead"))

    engineer = walk("eng1")
    page = engineer.page
    expect(page.locator("h1")).to_have_text("Flywheel")
    expect(page.locator("main")).to_contain_text("No store version yet")
    engineer.shot("flywheel")
    stages = page.locator("input[name=stages]:checked")
    assert sorted(stages.evaluate_all("els => els.map(e => e.value)")) == ["export", "validate"]
    page.click("button:text-is('Start')")
    expect(page).to_have_url(re.compile(r"/flywheel/iterations/\d+/$"))
    pk = int(page.url.rstrip("/").rsplit("/", 1)[1])
    # the page follows the iteration by itself (no reload) until it has finished
    status = page.locator("#iteration-status .pill").first
    expect(status).to_have_text("Succeeded", timeout=180_000)
    iteration = Iteration.objects.get(pk=pk)
    assert iteration.status == "succeeded", (iteration.error, worker.read_text()[-3000:])
    versions = DatasetVersion.objects.filter(iteration=iteration)
    assert versions.exists()
    # the panels drawn when the iteration ended show its results, not "nothing yet"
    expect(page.locator("main")).to_contain_text(f"Validated: {iteration.stages['validate']['output']['validated']}")
    expect(page.locator("main").locator("tr[id^=version-]")).to_have_count(versions.count())
    engineer.shot("flywheel-iteration")

    page.goto("/flywheel/stores/")
    link = page.locator("tr[id^=version-] a[download]").first
    expect(link).to_be_visible()
    with page.expect_download() as download:
        link.click()
    assert Path(download.value.path()).stat().st_size > 0
    engineer.shot("flywheel-stores")
    engineer.answers.only()


def test_the_superuser_lands_on_the_pool_and_reaches_the_admin(browser):
    walk, _ = browser
    UserFactory(username="root1", role=Role.DATA_LEAD, is_superuser=True, is_staff=True)
    TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    admin = walk("root1")
    page = admin.page
    expect(page).to_have_url(re.compile(r"/lead/$"))
    page.click("nav >> text=Admin")
    expect(page).to_have_url(re.compile(r"/admin/$"))
    main = page.locator("#content-main")
    expect(main).to_contain_text("Trajectories")
    expect(main).to_contain_text("Captures")
    expect(main).not_to_contain_text("Trajectorys")
    admin.shot("admin")
    page.click("#content-main >> text=Trajectories")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    admin.shot("admin-trajectories")
    page.click("text=Captures")
    expect(page.locator("#content")).to_contain_text("0 captures")
    admin.answers.only()


def upload(page: Page, name: str, content: bytes) -> None:
    page.set_input_files("input[name=file]", {"name": name, "mimeType": "application/json", "buffer": content})
    page.click("button:text-is('Import')")
