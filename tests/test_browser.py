"""End to end in real Chromium against the real servers: log in per role, live task-pool updates, the queue."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from playwright.sync_api import Page, expect, sync_playwright

from annotation_app.models import Role
from annotation_app.task_import import import_tasks

from .factories import ModelVersionFactory, TaskFactory, UserFactory
from .servers import web_stack

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture
def browser_page(transactional_db, tmp_path, monkeypatch):
    # Playwright's sync API keeps an event loop on this thread; the ORM calls made here are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with web_stack(tmp_path) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        errors: list[str] = []

        def new_page() -> Page:
            page = browser.new_context(base_url=base).new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            return page

        yield new_page
        browser.close()
        # Inside Playwright the ORM runs in a context of its own: close that connection too, or the test database
        # can't be dropped at the end.
        connection.close()
        assert not errors, f"JavaScript errors: {errors}"


def in_thread(function, *args):
    """Call `function` off Playwright's event-loop thread (Channels' async_to_sync refuses to run on it)."""

    def call():
        try:
            return function(*args)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def _log_in(page: Page, username: str) -> None:
    page.goto("/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "pw")
    page.click("button[type=submit]")


@pytest.mark.slow
def test_roles_land_on_their_pages_and_the_pool_updates_live(browser_page):
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    UserFactory(username="ann1", role=Role.ANNOTATOR)
    UserFactory(username="eng1", role=Role.ML_ENGINEER)
    TaskFactory(instruction="Open the settings app.", importance=5)
    TaskFactory(instruction="Close every window.", importance=1)
    ModelVersionFactory(name="ui-tars-demo")

    lead = browser_page()
    _log_in(lead, "lead1")
    expect(lead).to_have_url(re.compile(r"/lead/$"))
    expect(lead.locator("h1")).to_have_text("Task pool")
    expect(lead.locator("body")).to_have_attribute("data-events-state", "open", timeout=15_000)
    # Another data lead imports tasks: this page's table refreshes itself over the websocket.
    in_thread(import_tasks, b'[{"instruction": "Rename report.txt to summary.txt.", "importance": 9}]', "t.json")
    expect(lead.locator("#task-table")).to_contain_text("Rename report.txt to summary.txt.", timeout=15_000)

    annotator = browser_page()
    _log_in(annotator, "ann1")
    expect(annotator.locator("h1")).to_have_text("My queue")
    annotator.click("text=Get next task")
    expect(annotator.locator("#current-task .instruction")).to_have_text("Rename report.txt to summary.txt.")
    annotator.click("text=Skip this task")
    expect(annotator.locator("#current-task .instruction")).to_have_text("Open the settings app.")
    annotator.goto("/lead/")
    expect(annotator.locator("main")).to_contain_text("Your role may not manage tasks.")

    engineer = browser_page()
    _log_in(engineer, "eng1")
    expect(engineer.locator("h1")).to_have_text("Flywheel")
    expect(engineer.locator("main")).to_contain_text("ui-tars-demo")
