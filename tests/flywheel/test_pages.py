"""The flywheel's pages in every state: the iteration page (its status panel polls while the iteration runs and, once
it has ended, has the whole page drawn again; training progress, logs, evaluation beside the parent's, and plots that
follow the websocket without a reload) and the registry page (lineage, evaluation, serving, history, and the changes
an ML engineer makes there, whose refusals show on the page)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.urls import reverse
from playwright.sync_api import expect

from annotation_app.models import Role
from flywheel.iterations import run_iteration, start_iteration
from flywheel.models import DatasetVersion, Iteration, ModelPromotion, ModelVersion, Stage

from ..browsers import chromium_pages, log_in
from ..conftest import api_client_for
from ..factories import UserFactory
from ..servers import web_stack
from .helpers import population

pytestmark = pytest.mark.django_db


def test_the_page_is_drawn_again_once_the_iteration_it_watched_has_ended(client, make_user):
    population(random.Random(3), 12)
    iteration = start_iteration(None, enqueue=False, stages=[Stage.VALIDATE])
    client.force_login(make_user(Role.ML_ENGINEER))
    url = reverse("flywheel-iteration", args=[iteration.pk])
    page = client.get(url).content.decode()
    assert f"{url}?seen=running" in page  # drawn while queued: the status panel says so when it polls
    run_iteration(iteration.pk)
    polled = client.get(f"{url}?seen=running", HTTP_HX_REQUEST="true")
    assert polled.status_code == 204 and polled["HX-Refresh"] == "true"
    fresh = client.get(url).content.decode()
    assert "seen=running" not in fresh and "every 2s" not in fresh  # an ended iteration's page polls no more
    assert client.get(url, HTTP_HX_REQUEST="true").status_code == 200


# --- the iteration page in every state -------------------------------------------------------------------------------

SFT_RUNNING = {
    "status": "running", "done": 3, "total": 10, "command": ["python", "-m", "training", "sft"], "run_dir": "/runs/1",
    "metrics": [{"step": 1, "total_steps": 10, "loss": 2.5, "reward": 0.1},
                {"step": 3, "total_steps": 10, "loss": 1.25}],
    "log_tail": ["epoch 0 step 3 loss 1.25", "saving checkpoint"],
}  # fmt: skip
EVALUATED = {
    "status": "done", "done": 20, "total": 20,
    "output": {
        "new": {"success_rate": 0.4, "ci_low": 0.2, "ci_high": 0.6, "successes": 8, "episodes": 20, "mean_return": 0.4,
                "by_task": {"heldout-a": {"success_rate": 0.5, "successes": 5, "episodes": 10}, "heldout-b": 0.3}},
        "parent": {"success_rate": 0.2, "ci_low": 0.05, "ci_high": 0.4, "successes": 4, "episodes": 20},
        "model_id": 7, "parent_id": 3, "promoted": False,
    },
}  # fmt: skip
STATES = {
    "pending": {"status": "pending", "stages": {"sft": {"status": "pending", "done": 0, "total": None}}},
    "running": {"status": "running", "current_stage": "sft", "stages": {"sft": SFT_RUNNING}},
    "keys missing": {"status": "running",
                     "stages": {"sft": {}, "ppo": {"metrics": [None, {"loss": "x"}]}, "evaluate": {}}},
    "evaluated": {"status": "succeeded", "stages": {"sft": {**SFT_RUNNING, "status": "done", "output": {"model_id": 7}},
                                                    "evaluate": EVALUATED}},
    "no parent": {"status": "succeeded",
                  "stages": {"evaluate": {"status": "done", "output": {"new": {"success_rate": 1}}}}},
    "failed": {"status": "failed", "error": "RuntimeError: the trainer exited with 1", "stages": {"ppo": SFT_RUNNING}},
    "cancelled": {"status": "cancelled", "stages": {"ppo": {"status": "cancelled", "done": 1, "total": 5}}},
}  # fmt: skip


@pytest.mark.parametrize("state", STATES)
def test_the_iteration_page_renders_every_state(client, make_user, state):
    fields = STATES[state]
    iteration = Iteration.objects.create(selected_stages=list(fields["stages"]), **fields)
    client.force_login(make_user(Role.DATA_LEAD))
    url = reverse("flywheel-iteration", args=[iteration.pk])
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    fragment = client.get(url, HTTP_HX_REQUEST="true")
    assert fragment.status_code in (200, 204)
    if any(s in fields["stages"] for s in ("ct", "sft", "value", "ppo")):
        assert 'id="training-plots"' in html and 'id="iteration-stages"' in html and "js/flywheel.js" in html
    if state == "running":
        assert "step <strong>3</strong> of <strong>10</strong>" in html and "loss <strong>1.25</strong>" in html
        assert "epoch 0 step 3 loss 1.25\nsaving checkpoint" in html and "python -m training sft" in html
    if state == "evaluated":
        for text in ("40.0%", "20.0%", "20.0% – 60.0%", "8 / 20", "heldout-a", "50.0% (5 / 10)", "30.0%"):
            assert text in html, text
        assert reverse("flywheel-models") + "#model-7" in html and "Registered as" in html
        assert 'Automatic promotion: <span class="pill">not promoted</span>' in html
    if state == "no parent":
        assert "100.0%" in html and "—" in html
    if state == "failed":
        assert "the trainer exited with 1" in html


def test_the_stages_are_listed_in_the_order_they_run_not_as_the_database_keeps_them(client, make_user):
    """jsonb sorts an object's keys by length, then bytes ("ppo", "rft", "sft", "export", …): the page lists the
    stages as they run, with an unknown stage name last."""
    names = ["rft", "validate", "export", "sft", "ppo", "evaluate"]
    stages = {name: {"status": "done", "done": 1, "total": 1} for name in names} | {"later": {"status": "done"}}
    iteration = Iteration.objects.create(status="succeeded", selected_stages=names, stages=stages)
    iteration.refresh_from_db()
    assert list(iteration.stages)[:3] == ["ppo", "rft", "sft"]  # what PostgreSQL gives back
    client.force_login(make_user(Role.ML_ENGINEER))
    html = client.get(reverse("flywheel-iteration", args=[iteration.pk]), HTTP_HX_REQUEST="true").content.decode()
    rows = [html.index(f"<tr><td>{name}</td>") for name in [*names, "later"]]
    assert rows == sorted(rows)


# --- the registry page -----------------------------------------------------------------------------------------------


@pytest.fixture
def lineage(make_user):
    """A base model, a model an iteration trained from it (evaluated, promoted automatically), one by hand."""
    engineer = make_user(Role.ML_ENGINEER)
    base = ModelVersion.objects.create(name="base-model", checkpoint_uri="/b", endpoint_url="http://127.0.0.1:9/v1")
    base.promote(by=engineer, reason="the first one")
    iteration = Iteration.objects.create(base_model=base, started_by=engineer, selected_stages=["sft"])
    version = DatasetVersion.objects.create(kind="sft", number=1, iteration=iteration, row_count=12, added_count=12)
    trained = ModelVersion.objects.create(
        name="it-sft", checkpoint_uri="/runs/sft", parent=base, iteration=iteration, stage="sft",
        metrics={"loss": 0.75, "steps": 10, "curve": [1, 2]},
        serve_command="vllm serve /runs/sft --served-model-name it-sft",
        evaluation={"new": {"success_rate": 0.5, "episodes": 10, "successes": 5, "by_task": {"t": 0.5}},
                    "parent": {"success_rate": 0.25, "episodes": 10, "successes": 2},
                    "promotion": {"promoted": True, "reason": "it-sft beats base-model"}},
    )  # fmt: skip
    trained.dataset_versions.add(version)
    trained.promote(by=None, action="auto", reason="it-sft beats base-model")
    by_hand = ModelVersion.objects.create(name="by-hand", checkpoint_uri="hf://x", created_by=engineer)
    return {"engineer": engineer, "base": base, "trained": trained, "by_hand": by_hand, "version": version}


def test_the_registry_page_shows_lineage_evaluation_serving_and_history(client, make_user, lineage):
    client.force_login(make_user(Role.DATA_LEAD))  # leads read it, without the buttons
    html = client.get(reverse("flywheel-models")).content.decode()
    trained, base, version = lineage["trained"], lineage["base"], lineage["version"]
    assert f'id="model-{trained.pk}"' in html and f'href="#model-{base.pk}">base-model</a>' in html
    assert reverse("flywheel-iteration", args=[trained.iteration_id]) in html and "stage sft" in html
    assert f"{reverse('flywheel-stores')}#version-{version.pk}" in html and "SFT v1</a> (12 rows)" in html
    assert "50.0%" in html and "25.0%" in html and "vllm serve /runs/sft" in html and "0.75" in html
    assert reverse("flywheel-model-health", args=[base.pk]) in html  # health loads after the page
    assert "none: cannot serve" in html  # the models without an endpoint
    assert "Promoted automatically" in html and "it-sft beats base-model" in html and "the first one" in html
    assert "registered by hand by" in html
    assert "<form" not in html.split("<main>")[1] and "Register a model" not in html  # no buttons for leads
    panel = client.get(reverse("flywheel-models") + "?panel=registry", HTTP_HX_REQUEST="true").content.decode()
    assert panel.startswith('<div id="registry"') and "page:flywheel_models from:body" in panel


def test_registry_changes_from_the_page_show_their_4xx_in_the_panel(client, lineage):
    client.force_login(lineage["engineer"])
    base, by_hand, trained = lineage["base"], lineage["by_hand"], lineage["trained"]
    html = client.get(reverse("flywheel-models")).content.decode()
    assert "Register a model" in html and "Demote (no active model)" in html
    assert reverse("flywheel-rollback", args=[base.pk]) in html  # older than the active one: a rollback
    assert reverse("flywheel-promote", args=[by_hand.pk]) in html  # newer: a promotion
    htmx = {"HTTP_HX_REQUEST": "true"}

    refused = client.post(reverse("flywheel-promote", args=[by_hand.pk]), **htmx)
    assert refused.status_code == 409 and 'id="registry"' in refused.content.decode()
    assert "by-hand was not promoted: it has no endpoint URL" in refused.content.decode()
    too_new = client.post(reverse("flywheel-rollback", args=[by_hand.pk]), {"force": "1"}, **htmx)
    assert too_new.status_code == 409 and "newer than it-sft and was never active" in too_new.content.decode()

    back = client.post(reverse("flywheel-rollback", args=[base.pk]), {"force": "1", "reason": "regression"}, **htmx)
    assert back.status_code == 200 and "base-model is the annotation model again" in back.content.decode()
    assert ModelVersion.objects.get(is_active=True) == base
    assert ModelPromotion.objects.filter(action="rollback", from_model=trained, to_model=base, forced=True).exists()

    assert client.post(reverse("flywheel-demote"), {"reason": "maintenance"}, **htmx).status_code == 200
    again = client.post(reverse("flywheel-demote"), **htmx)
    assert again.status_code == 409 and "no model is active" in again.content.decode()
    assert "No model is active" in client.get(reverse("flywheel-models")).content.decode()

    plain = client.post(reverse("flywheel-promote", args=[by_hand.pk]), {"force": "1"}, follow=True)
    assert "by-hand is now the annotation model" in plain.content.decode()


def test_registering_from_the_page(client, lineage):
    client.force_login(lineage["engineer"])
    htmx = {"HTTP_HX_REQUEST": "true"}
    url = reverse("flywheel-register")
    bad = client.post(url, {"name": "", "checkpoint_uri": "/c", "endpoint_url": "not a url"}, **htmx)
    body = bad.content.decode()
    assert bad.status_code == 400 and 'id="register-card"' in body and "This field is required" in body
    assert "Enter a valid URL" in body
    taken = client.post(url, {"name": "by-hand", "checkpoint_uri": "/c"}, **htmx)
    assert taken.status_code == 400 and "already registered" in taken.content.decode()
    ok = client.post(
        url,
        {"name": "ui-tars-7b", "checkpoint_uri": "hf://ByteDance-Seed/UI-TARS-1.5-7B", "endpoint_url": "http://10.0.0.5:8000/v1",
         "served_name": "ui-tars", "parent": lineage["base"].pk},
        **htmx,
    )  # fmt: skip
    assert ok.status_code == 200 and "ui-tars-7b is registered" in ok.content.decode()
    assert ok["HX-Trigger"] == "registry-changed"
    model = ModelVersion.objects.get(name="ui-tars-7b")
    assert model.parent == lineage["base"] and model.created_by == lineage["engineer"]
    assert model.serve_command.startswith("vllm serve hf://ByteDance-Seed/UI-TARS-1.5-7B --served-model-name ui-tars")
    plain_bad = client.post(url, {"name": "x"})
    assert plain_bad.status_code == 400 and "<html" in plain_bad.content.decode()


def test_the_registry_api_shows_lineage_and_changes_it(lineage):
    client = api_client_for(lineage["engineer"])
    trained, base = lineage["trained"], lineage["base"]
    body = client.get(reverse("flywheel-model-detail", args=[trained.pk])).json()
    assert body["iteration"] == trained.iteration_id and body["stage"] == "sft" and body["parent"] == base.pk
    assert body["dataset_versions"] == [lineage["version"].pk] and body["evaluation"]["new"]["success_rate"] == 0.5
    assert body["serve_command"].startswith("vllm serve") and body["promotions"][0]["action"] == "auto"
    refused = client.post(reverse("flywheel-model-promote", args=[lineage["by_hand"].pk]), {}, format="json")
    assert refused.status_code == 409 and "force=true" in refused.json()["detail"]
    bad = client.post(reverse("flywheel-model-promote", args=[base.pk]), {"force": "very"}, format="json")
    assert bad.status_code == 400
    back = client.post(reverse("flywheel-model-rollback", args=[base.pk]), {"force": True}, format="json")
    assert back.status_code == 200 and back.json()["is_active"] is True
    demoted = client.post(reverse("flywheel-model-demote"), {"reason": "r"}, format="json")
    assert demoted.status_code == 200 and demoted.json()["from_name"] == "base-model"
    assert client.post(reverse("flywheel-model-demote"), {}, format="json").status_code == 409
    created = client.post(
        reverse("flywheel-model-list"), {"name": "api-model", "checkpoint_uri": "/x", "colour": 1}, format="json"
    )
    assert created.status_code == 400  # unknown field
    created = client.post(reverse("flywheel-model-list"), {"name": "api-model", "checkpoint_uri": "/x"}, format="json")
    assert created.status_code == 201 and created.json()["created_by"] == lineage["engineer"].username
    assert client.post(reverse("flywheel-model-list"), {"name": "api-model", "checkpoint_uri": "/y"}).status_code == 400
    history = client.get(reverse("flywheel-promotion-list")).json()["results"]
    assert [h["action"] for h in history][:2] == ["demote", "rollback"]
    paths = client.get(reverse("schema"), {"format": "json"}).json()["paths"]
    for path in ("/api/flywheel/models/", "/api/flywheel/models/{id}/promote/", "/api/flywheel/models/{id}/rollback/",
                 "/api/flywheel/models/demote/", "/api/flywheel/promotions/"):  # fmt: skip
        assert path in paths, path


# --- the plots follow the websocket, in real Chromium ----------------------------------------------------------------


def _rows(n: int) -> list[dict]:
    return [{"step": i, "total_steps": 50, "loss": 3.0 / i, "reward": i / 50} for i in range(1, n + 1)]


def _pushed(iteration_id: int, rows: int) -> None:
    """Another process's stage writes new metric rows and pushes the iteration (off Playwright's event loop)."""
    from flywheel.iterations import push

    try:
        iteration = Iteration.objects.get(pk=iteration_id)
        iteration.stages["sft"]["metrics"] = _rows(rows)
        iteration.stages["sft"]["done"] = rows
        iteration.save(update_fields=["stages"])
        push(iteration)
    finally:
        connection.close()


@pytest.mark.slow
def test_the_training_plots_update_from_a_pushed_event_without_a_reload(transactional_db, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread
    UserFactory(username="eng-plots", role=Role.ML_ENGINEER)
    stages = {"sft": {"status": "running", "done": 2, "total": 50, "metrics": _rows(2)}}
    iteration = Iteration.objects.create(
        status=Iteration.Status.RUNNING, current_stage="sft", selected_stages=["sft"], stages=stages
    )
    with web_stack(tmp_path) as base, chromium_pages(base) as new_page:
        page = new_page()
        log_in(page, "eng-plots")
        page.goto(reverse("flywheel-iteration", args=[iteration.pk]))
        expect(page.locator("body")).to_have_attribute("data-events-state", "open", timeout=15_000)
        loss = page.locator('#training-plots svg[data-metric="loss"]')
        expect(loss).to_have_attribute("data-points", "2")
        expect(page.locator('#training-plots svg[data-metric="reward"]')).to_have_attribute("data-points", "2")
        page.evaluate("window.stillTheSamePage = true")
        with ThreadPoolExecutor(1) as pool:
            pool.submit(_pushed, iteration.pk, 7).result()
        expect(loss).to_have_attribute("data-points", "7", timeout=15_000)
        assert page.locator("#training-plots polyline").count() == 2  # loss and reward, one line each
        assert page.evaluate("window.stillTheSamePage") is True  # redrawn in place, not reloaded
        expect(page.locator("#iteration-status .training-progress")).to_contain_text("step 7 of 50", timeout=15_000)


def test_cancelling_an_ended_iteration_from_its_page_says_why(client, make_user):
    iteration = Iteration.objects.create(status=Iteration.Status.SUCCEEDED, selected_stages=["validate"])
    client.force_login(make_user(Role.ML_ENGINEER))
    response = client.post(reverse("flywheel-cancel", args=[iteration.pk]))
    assert response.status_code == 409 and f"Not cancelled: iteration {iteration.pk} has already succeeded" in (
        response.content.decode()
    )
    assert f"<h1>Iteration {iteration.pk}</h1>" in response.content.decode()
