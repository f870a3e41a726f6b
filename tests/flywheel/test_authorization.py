"""Every flywheel page and endpoint for every role: ML engineers (and superusers) start and cancel iterations and
register, promote, roll back and demote models; data leads and ML engineers read iterations, the stores and the
registry; annotators and anonymous users get nothing. Plus the API's and the form's answers to bad input (4xx, never
500)."""

from __future__ import annotations

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.urls import reverse

from flywheel.forms import IterationForm
from flywheel.models import DatasetVersion, Iteration, ModelVersion, Stage

from ..access import assert_answer, client_as, reach
from ..conftest import ROLES, api_client_for

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
READERS = {L, M, S}
RUNNERS = {M, S}

# (url name, method, kind, roles allowed); tests/test_authorization.py takes these names as covered.
FLYWHEEL_MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("flywheel-start", "post", "page", RUNNERS),
    ("flywheel-cancel", "post", "page", RUNNERS),
    ("flywheel-iteration", "get", "page", READERS),
    ("flywheel-stores", "get", "page", READERS),
    ("flywheel-dataset-file", "get", "page", READERS),
    ("flywheel-iteration-list", "get", "api", READERS),
    ("flywheel-iteration-list", "post", "api", RUNNERS),
    ("flywheel-iteration-detail", "get", "api", READERS),
    ("flywheel-iteration-cancel", "post", "api", RUNNERS),
    ("flywheel-iteration-validations", "get", "api", READERS),
    ("flywheel-dataset-list", "get", "api", READERS),
    ("flywheel-dataset-detail", "get", "api", READERS),
    ("flywheel-models", "get", "page", READERS),
    ("flywheel-model-health", "get", "page", READERS),
    ("flywheel-register", "post", "page", RUNNERS),
    ("flywheel-rollback", "post", "page", RUNNERS),
    ("flywheel-demote", "post", "page", RUNNERS),
    ("flywheel-model-list", "get", "api", READERS),
    ("flywheel-model-list", "post", "api", RUNNERS),
    ("flywheel-model-detail", "get", "api", READERS),
    ("flywheel-model-promote", "post", "api", RUNNERS),
    ("flywheel-model-rollback", "post", "api", RUNNERS),
    ("flywheel-model-demote", "post", "api", RUNNERS),
    ("flywheel-promotion-list", "get", "api", READERS),
]
FLYWHEEL_ROUTES = {name for name, *_ in FLYWHEEL_MATRIX}


@pytest.fixture
def objects(db, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    iteration = Iteration.objects.create(selected_stages=["validate"], stages={"validate": {"status": "pending"}})
    default_storage.save("flywheel/stores/sft/episodes-v0001.jsonl", ContentFile(b'{"messages": []}\n'))
    version = DatasetVersion.objects.create(
        kind="sft",
        number=1,
        iteration=iteration,
        manifest={
            "root": "flywheel/stores/sft",
            "files": [{"path": "episodes-v0001.jsonl", "role": "episodes", "sha256": "x", "bytes": 17, "version": 1}],
        },
    )
    model = ModelVersion.objects.create(name="m", checkpoint_uri="/m", endpoint_url="http://127.0.0.1:9/v1")
    return {"iteration": iteration, "version": version, "model": model}


def _url(name: str, objects) -> str:
    if name == "flywheel-dataset-file":
        return reverse(name, args=[objects["version"].pk, "episodes-v0001.jsonl"])
    if name in ("flywheel-dataset-detail",):
        return reverse(name, args=[objects["version"].pk])
    if name in ("flywheel-model-health", "flywheel-rollback", "flywheel-model-detail") or name in (
        "flywheel-model-promote",
        "flywheel-model-rollback",
    ):
        return reverse(name, args=[objects["model"].pk])
    if (
        name.startswith("flywheel-model")
        or name.startswith("flywheel-promotion")
        or name
        in (
            "flywheel-start",
            "flywheel-stores",
            "flywheel-iteration-list",
            "flywheel-dataset-list",
            "flywheel-models",
            "flywheel-register",
            "flywheel-demote",
        )
    ):
        return reverse(name)
    return reverse(name, args=[objects["iteration"].pk])


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("name", "method", "kind", "allowed"), FLYWHEEL_MATRIX, ids=[f"{m} {n}" for n, m, *_ in FLYWHEEL_MATRIX]
)
def test_authorization(role, name, method, kind, allowed, objects, make_user):
    url = _url(name, objects)
    response = reach(client_as(role, make_user), method, url, kind)
    assert_answer(response, role, allowed, kind, method, url)
    if role in allowed and name == "flywheel-dataset-file":
        assert b"".join(response.streaming_content) == b'{"messages": []}\n'


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"stages": ["validate", "export", "ppo"]}, 400, "base model"),  # needs one with a checkpoint
        ({"stages": ["teleport"]}, 400, "is not a valid choice"),
        ({"modes": ["telepathy"]}, 400, "is not a valid choice"),
        ({"config": {"v": {"weights": {"vibes": 1}}}}, 400, "unknown V component"),
        ({"config": {"v": {"threshold": 7}}}, 400, "threshold must be a number from 0 to 1"),
        ({"config": "high"}, 400, "dictionary"),
        ({"colour": "blue"}, 400, "Unknown field"),
        ({"date_from": "2026-02-01T00:00:00Z", "date_to": "2026-01-01T00:00:00Z"}, 400, "date_from must be before"),
        ({"base_model": 999999}, 400, "object does not exist"),
    ],
)
def test_bad_starts_are_400_with_the_reason(body, status, text, make_user):
    response = api_client_for(make_user("ml_engineer")).post(reverse("flywheel-iteration-list"), body, format="json")
    assert response.status_code == status, response.content
    assert text in response.content.decode()
    assert not Iteration.objects.exists()


def test_start_records_the_iteration_and_its_config(make_user, django_capture_on_commit_callbacks):
    engineer = make_user("ml_engineer")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api_client_for(engineer).post(
            reverse("flywheel-iteration-list"),
            {"modes": ["interactive"], "domains": ["chrome"], "config": {"v": {"threshold": 0.6}}},
            format="json",
        )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending" and body["started_by"] == engineer.username
    assert body["selected_stages"] == ["validate", "export"]
    assert body["config"]["v"]["threshold"] == 0.6 and body["config"]["v"]["weights"]["verifier"] == 2.0
    assert body["config"]["export"] == {"coordinates": "absolute", "parquet_images": "bytes"}
    assert len(callbacks) == 1  # queued on commit (the worker test runs it)


def test_cancel_of_a_finished_iteration_is_a_409(make_user):
    iteration = Iteration.objects.create(status=Iteration.Status.SUCCEEDED, selected_stages=["validate"])
    response = api_client_for(make_user("ml_engineer")).post(reverse("flywheel-iteration-cancel", args=[iteration.pk]))
    assert response.status_code == 409 and "already succeeded" in response.json()["detail"]


def test_unknown_files_and_routes_are_refused(objects, make_user):
    client = api_client_for(make_user("data_lead"))
    client.force_login(make_user("data_lead"))
    version = objects["version"]
    assert client.get(reverse("flywheel-dataset-file", args=[version.pk, "../../../etc/passwd"])).status_code == 404
    assert client.get(reverse("flywheel-dataset-file", args=[version.pk, "rows-v0001.txt"])).status_code == 404
    url = reverse("flywheel-iteration-validations", args=[objects["iteration"].pk])
    assert client.get(url + "?route=maybe").status_code == 400


def test_the_page_form_starts_an_iteration_and_shows_errors(make_user, django_capture_on_commit_callbacks):
    client = api_client_for(None)
    client.force_login(make_user("ml_engineer"))
    page = client.get(reverse("flywheel"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Start an iteration" in html
    for stage in Stage:  # every stage is listed (those this build cannot run say so)
        assert f'value="{stage.value}"' in html and stage.label in html
    assert 'name="promote"' in html and 'value="auto"' in html and 'name="preset"' in html
    form = {"stages": ["validate", "export", "sft"], "threshold": "0.5", "coordinates": "absolute"}
    refused = client.post(reverse("flywheel-start"), form)
    assert refused.status_code == 400 and "base model" in refused.content.decode()  # said on the page
    bad = client.post(reverse("flywheel-start"), {"stages": ["validate"], "threshold": "2", "coordinates": "absolute"})
    assert bad.status_code == 400 and "Ensure this value is less than or equal to 1" in bad.content.decode()
    bad_json = client.post(
        reverse("flywheel-start"),
        {"stages": ["validate"], "threshold": "0.5", "coordinates": "absolute", "v_config": "{nope"},
    )
    assert bad_json.status_code == 400 and "not JSON" in bad_json.content.decode()
    with django_capture_on_commit_callbacks(execute=False):
        ok = client.post(
            reverse("flywheel-start"),
            {"stages": ["validate", "export"], "threshold": "0.7", "coordinates": "absolute", "domains": "chrome, os"},
        )
    iteration = Iteration.objects.get()
    assert ok.status_code == 302 and ok["Location"] == reverse("flywheel-iteration", args=[iteration.pk])
    assert iteration.domains == ["chrome", "os"] and iteration.config["v"]["threshold"] == 0.7
    detail = client.get(ok["Location"])
    assert detail.status_code == 200 and "Pending" in detail.content.decode()
    fragment = client.get(ok["Location"], HTTP_HX_REQUEST="true")
    assert 'id="iteration-status"' in fragment.content.decode() and "<html" not in fragment.content.decode()
    panel = client.get(reverse("flywheel") + "?panel=iterations", HTTP_HX_REQUEST="true")
    assert 'id="iterations"' in panel.content.decode() and "every 3s" in panel.content.decode()


def test_the_schema_documents_the_flywheel_api(make_user):
    schema = api_client_for(make_user("ml_engineer")).get(reverse("schema"), {"format": "json"})
    paths = schema.json()["paths"]
    assert "/api/flywheel/iterations/" in paths and "post" in paths["/api/flywheel/iterations/"]
    assert "/api/flywheel/iterations/{id}/cancel/" in paths and "/api/flywheel/datasets/" in paths


@pytest.mark.parametrize(
    ("stages", "promote", "preset", "expected"),
    [
        (["validate", "export"], "auto", "default", {}),
        (["export", "sft", "evaluate"], "auto", "default", {"train": {"preset": "default"}, "promote": "auto"}),
        (["ppo"], "", "", {"train": {"preset": "tiny-cpu"}}),
        (["sft", "evaluate"], "", "tiny-cpu", {"train": {"preset": "tiny-cpu"}, "promote": "manual"}),
    ],
)
def test_the_form_sets_the_trainer_preset_and_promotion_only_with_their_stages(stages, promote, preset, expected):
    form = IterationForm(
        {"stages": stages, "threshold": "0.8", "coordinates": "absolute", "promote": promote, "preset": preset}
    )
    assert form.is_valid(), form.errors
    config = form.config()
    assert {k: v for k, v in config.items() if k in ("train", "promote")} == expected
    assert config["v"]["threshold"] == 0.8 and config["export"] == {"coordinates": "absolute"}
