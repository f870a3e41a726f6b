"""In real Chromium: the quality dashboard draws its two uPlot charts with data, queues a refresh from its button,
and the model registry shows the acceptance table; no JavaScript or console error on the way."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from annotation_app.models import Role, Step, Trajectory
from annotation_app.quality import aggregates

from ..browsers import chromium_pages, log_in
from ..factories import ModelVersionFactory, StepFactory, TrajectoryFactory, UserFactory
from ..servers import web_stack

pytestmark = pytest.mark.slow


@pytest.fixture
def browser_page(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        yield new_page


def console_errors(page: Page) -> list[str]:
    """Console errors of `page`, with their source; Chromium's own /favicon.ico probe (the site has none) aside."""
    errors: list[str] = []

    def record(message) -> None:
        where = message.location.get("url", "")
        if message.type == "error" and not where.endswith("/favicon.ico"):
            errors.append(f"{message.text} ({where})")

    page.on("console", record)
    return errors


def work_over_three_days() -> None:
    annotator = UserFactory(username="ann-1")
    models = [ModelVersionFactory(name=f"policy-{n}") for n in (1, 2)]
    today = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0).astimezone(UTC)
    for day in range(3):
        when: datetime = today - timedelta(days=day)
        trajectory = TrajectoryFactory(annotator=annotator, status=Trajectory.Status.SUBMITTED, submitted_at=when)
        for index, model in enumerate(models):
            chosen = 0 if (day + index) % 2 else None
            step = StepFactory(trajectory=trajectory, index=index, model_version=model, chosen_candidate=chosen,
                               candidates=[{"action_text": "click(start_box='(10,20)')",
                                            "actions": [{"type": "click"}]}])  # fmt: skip
            Step.objects.filter(pk=step.pk).update(created_at=when)


def canvas_has_ink(page: Page, selector: str) -> bool:
    return page.eval_on_selector(
        selector,
        """canvas => { const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
                       for (let i = 3; i < d.length; i += 4) if (d[i] > 0) return true; return false; }""",
    )


def test_the_dashboard_draws_its_plots(browser_page):
    UserFactory(username="lead1", role=Role.DATA_LEAD)
    UserFactory(username="ml1", role=Role.ML_ENGINEER)
    work_over_three_days()
    aggregates.refresh("test")

    page = browser_page()
    errors = console_errors(page)
    log_in(page, "lead1")
    page.wait_for_url(re.compile(r"/lead/$"))
    page.click("nav >> text=Quality")
    expect(page.locator("h1")).to_have_text("Quality")
    expect(page.locator("#as-of")).to_contain_text("As of")
    for plot in ("#plot-throughput", "#plot-acceptance"):
        expect(page.locator(f"{plot} canvas")).to_have_count(1)
        assert canvas_has_ink(page, f"{plot} canvas")
    lengths = page.evaluate("[0, 1, 2].map(i => window.qualityCharts.throughput.data[i].length)")
    assert lengths == [3, 3, 3]
    assert page.evaluate("window.qualityCharts.acceptance.data[0].length") == 2
    expect(page.locator("#annotators")).to_contain_text("ann-1")
    page.click("button:text-is('Refresh')")
    expect(page.locator("#refresh-status")).to_contain_text("Refresh queued")

    page = browser_page()
    more_errors = console_errors(page)
    log_in(page, "ml1")
    page.wait_for_url(re.compile(r"/flywheel/$"))
    page.goto("/flywheel/models/")
    expect(page.locator("#model-acceptance")).to_contain_text("policy-2")
    assert errors == [] and more_errors == []
