"""The quality pages over real aggregates: the dashboard, CSV downloads, the refresh status, bad input (4xx), the
registry's acceptance fragment, and the refresh button's task run by a real Celery worker."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from annotation_app.models import Trajectory
from annotation_app.quality import aggregates
from annotation_app.quality.models import AnnotatorStats, Refresh

from ..factories import ModelVersionFactory, StepFactory, TrajectoryFactory, UserFactory


@pytest.fixture
def lead_client(client, lead):
    client.force_login(lead)
    return client


def some_work() -> None:
    annotator = UserFactory(username="ann-z")
    model = ModelVersionFactory(name="policy-z")
    trajectory = TrajectoryFactory(annotator=annotator, status=Trajectory.Status.SUBMITTED)
    StepFactory(trajectory=trajectory, index=0, model_version=model, chosen_candidate=None,
                candidates=[{"thought": "", "action_text": "wait()", "actions": [{"type": "wait"}]}])  # fmt: skip


def test_the_dashboard_shows_the_latest_figures(lead_client):
    page = lead_client.get(reverse("quality"))
    assert page.status_code == 200 and "Not computed yet" in page.text
    assert 'hx-trigger="load, submit"' in page.text, "a page never computed asks for its first refresh"
    some_work()
    done = aggregates.refresh("test")
    page = lead_client.get(reverse("quality"))
    assert page.status_code == 200 and "hx-trigger" not in page.text
    assert "As of" in page.text and "ann-z" in page.text and "policy-z" in page.text
    assert 'id="quality-plots"' in page.text and "uPlot.iife.min.js" in page.text
    assert f"computed in {done.duration_ms} ms" in page.text
    # The figures are cached per refresh: new work shows after the next refresh, not before.
    TrajectoryFactory(annotator=UserFactory(username="ann-y"), status=Trajectory.Status.SUBMITTED)
    assert "ann-y" not in lead_client.get(reverse("quality")).text
    aggregates.refresh("test")
    assert "ann-y" in lead_client.get(reverse("quality")).text


def test_csv_downloads_and_unknown_tables(lead_client):
    some_work()
    aggregates.refresh("test")
    response = lead_client.get(reverse("quality-csv", args=["annotators"]))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="quality-annotators.csv"' in response["Content-Disposition"]
    assert response.content.decode().splitlines()[1].startswith("ann-z,1,1,")
    missing = lead_client.get(reverse("quality-csv", args=["salaries"]))
    assert missing.status_code == 404 and "There is no table" in missing.text


def test_the_status_panel_reloads_the_page_once_newer_figures_are_in(lead_client):
    url = reverse("quality")
    bad = lead_client.get(url, {"panel": "status", "after": "x"})
    assert bad.status_code == 400 and "refresh number" in bad.text
    waiting = lead_client.get(url, {"panel": "status", "after": "0"})
    assert waiting.status_code == 200 and "Refresh queued" in waiting.text
    done = aggregates.refresh("test")
    newer = lead_client.get(url, {"panel": "status", "after": str(done.pk - 1)})
    assert newer.status_code == 204 and newer["HX-Refresh"] == "true"
    assert lead_client.get(url, {"panel": "status", "after": str(done.pk)}).status_code == 200


def test_the_registry_page_loads_the_acceptance_table(client, engineer):
    client.force_login(engineer)
    some_work()
    aggregates.refresh("test")
    registry = client.get(reverse("flywheel-models"))
    assert reverse("quality-acceptance") in registry.text
    fragment = client.get(reverse("quality-acceptance"), HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and "policy-z" in fragment.text and "100.0 %" in fragment.text  # overridden


def test_the_refresh_button_runs_the_task_on_a_worker(worker, client, make_user):
    from annotation_app.quality.tasks import refresh

    client.force_login(make_user("data_lead"))
    some_work()
    response = client.post(reverse("quality-refresh"))
    assert response.status_code == 200 and "Refresh queued" in response.text
    deadline = time.monotonic() + 120
    while not Refresh.objects.filter(trigger="button").exists():
        assert time.monotonic() < deadline, f"no refresh ran; worker log:\n{worker.read_text()[-3000:]}"
        time.sleep(0.2)
    assert Refresh.objects.get(trigger="button").status == Refresh.Status.DONE
    assert AnnotatorStats.objects.get(username="ann-z").trajectories == 1
    result = refresh.delay("test").get(timeout=120)  # the task's own answer, through the broker
    assert result["refresh"] == Refresh.objects.filter(trigger="test").get().pk
