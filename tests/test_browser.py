"""End to end in real Chromium against the real servers: log in per role, live task-pool updates, the queue."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from playwright.sync_api import expect

from annotation_app.models import Role
from annotation_app.task_import import import_tasks

from .browsers import chromium_pages, log_in
from .factories import ModelVersionFactory, TaskFactory, UserFactory
from .servers import web_stack


@pytest.fixture
def browser_page(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        yield new_page


def in_thread(function, *args):
    """Call `function` off Playwright's event-loop thread (Channels' async_to_sync refuses to run on it)."""

    def call():
        try:
            return function(*args)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


@pytest.mark.slow
def test_roles_land_on_their_pages_and_the_pool_updates_live(browser_page):
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    UserFactory(username="ann1", role=Role.ANNOTATOR)
    UserFactory(username="eng1", role=Role.ML_ENGINEER)
    TaskFactory(instruction="Open the settings app.", importance=5)
    TaskFactory(instruction="Close every window.", importance=1)
    ModelVersionFactory(name="ui-tars-demo")

    lead = browser_page()
    log_in(lead, "lead1")
    expect(lead).to_have_url(re.compile(r"/lead/$"))
    expect(lead.locator("h1")).to_have_text("Task pool")
    expect(lead.locator("body")).to_have_attribute("data-events-state", "open", timeout=15_000)
    # Another data lead imports tasks: this page's table refreshes itself over the websocket.
    in_thread(import_tasks, b'[{"instruction": "Rename report.txt to summary.txt.", "importance": 9}]', "t.json")
    expect(lead.locator("#task-table")).to_contain_text("Rename report.txt to summary.txt.", timeout=15_000)

    annotator = browser_page()
    log_in(annotator, "ann1")
    expect(annotator.locator("h1")).to_have_text("My queue")
    annotator.click("text=Get next task")
    expect(annotator.locator("#current-task .instruction")).to_have_text("Rename report.txt to summary.txt.")
    annotator.click("text=Skip this task")
    expect(annotator.locator("#current-task .instruction")).to_have_text("Open the settings app.")
    annotator.goto("/lead/")
    expect(annotator.locator("main")).to_contain_text("Your role may not manage tasks.")

    engineer = browser_page()
    log_in(engineer, "eng1")
    expect(engineer.locator("h1")).to_have_text("Flywheel")
    expect(engineer.locator("main")).to_contain_text("ui-tars-demo")
