"""Issue 14's done-when: each role walks its flows in real Chromium on the real stack (gunicorn, daphne, a Celery
worker; the sandbox service and websockify for the annotator's desktop), and every page shows what it should.

Every answer of 400 or more that a page gets is collected, and each test names the ones it provoked on purpose (and
checks the page showed them): any other is a failure, so no error goes unshown. Screenshots of each page are kept
under the test's tmp dir. Waits are explicit (Playwright's expect, a worker's result); no sleep is an assertion."""

from __future__ import annotations

import random
import re
import time
import warnings
from pathlib import Path

import pytest
from playwright.sync_api import Page, Response, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from annotation_app.models import Capture, Review, Role, Task, Trajectory
from flywheel.models import DatasetVersion, Iteration

from .browsers import chromium_pages, log_in
from .conftest import celery_worker
from .factories import StepFactory, TaskFactory, TrajectoryFactory, UserFactory
from .flywheel.helpers import png, population
from .live.conftest import live_services, live_settings, needs_desktop, policy_url, tiny_checkpoint  # noqa: F401
from .servers import web_stack

pytestmark = pytest.mark.slow


class Answers:
    """The HTTP answers of 400 or more a page got (the favicon aside), to be matched against the expected ones."""

    def __init__(self, page: Page) -> None:
        self.failed: list[tuple[int, str]] = []
        page.on("response", self._seen)

    def _seen(self, response: Response) -> None:
        if response.status >= 400 and not response.url.endswith("/favicon.ico"):
            self.failed.append((response.status, response.url))

    def only(self, *expected: tuple[int, str]) -> None:
        """Every failed answer is one of `expected` (status, URL pattern), and each expected one happened."""
        unexpected = [f for f in self.failed if not any(f[0] == s and re.search(p, f[1]) for s, p in expected)]
        assert not unexpected, f"answers nobody expected: {unexpected}"
        for status, pattern in expected:
            assert any(f[0] == status and re.search(pattern, f[1]) for f in self.failed), (status, pattern)


class Walk:
    """One signed-in page of one role, its answers watched and its screenshots saved under the test's tmp dir."""

    def __init__(self, page: Page, shots: Path, username: str) -> None:
        self.page, self.shots, self.answers = page, shots, Answers(page)
        log_in(page, username)
        page.wait_for_url(re.compile(r"/(lead|annotate|flywheel)/$"))

    def shot(self, name: str) -> None:
        """A screenshot for people to look at: a record, not an assertion, so one that times out on a loaded machine
        (a long full page) is skipped with a warning rather than failing the walk."""
        try:
            self.page.screenshot(path=self.shots / f"{name}.png", full_page=True, timeout=60_000)
        except PlaywrightTimeout as exc:
            warnings.warn(f"screenshot {name} skipped: {exc.message.splitlines()[0]}", stacklevel=2)


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
    expect(page.locator("#task-table tbody tr")).to_have_count(1)
    expect(page.locator("#task-table")).to_contain_text("Sum column B")
    lead.shot("lead-pool-filtered")

    # the task's page: edit, archive, requeue
    page.click(f"#task-table a[href='/lead/tasks/{task.pk}/']")
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


@needs_desktop
def test_the_annotator_records_submits_sees_the_rejection_fixes_and_resubmits(
    live_settings,  # noqa: F811
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
        expect(page.locator(".save-state").first).to_have_text("saved")
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
        expect(page.locator(".save-state").first).to_have_text("saved")
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


def upload(page: Page, name: str, content: bytes) -> None:
    page.set_input_files("input[name=file]", {"name": name, "mimeType": "application/json", "buffer": content})
    page.click("button:text-is('Import')")


def wait_for_capture(capture_id: int, worker: Path, timeout: float = 240) -> Capture:
    """The capture once the worker has processed it (ready), or a failure with the reason and the worker's log."""
    deadline = time.monotonic() + timeout
    while (capture := Capture.objects.get(pk=capture_id)).status not in ("ready", "failed"):
        assert time.monotonic() < deadline, f"capture still {capture.status} ({capture.stage})"
        time.sleep(0.5)
    assert capture.status == "ready", (capture.error, worker.read_text()[-2000:])
    return capture
