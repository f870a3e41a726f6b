"""Every endpoint and every role (anonymous included): allowed roles get past the permission check, others don't.

`test_every_route_is_in_the_matrix` fails when a new URL is added without a row here.
"""

from __future__ import annotations

import uuid

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from annotation_app.models import Capture, LiveSession, Task, Trajectory

from .agreement.test_authorization import AGREEMENT_ROUTES
from .conftest import ROLES, api_client_for
from .curation.test_authorization import CURATION_ROUTES
from .factories import ModelVersionFactory, StepFactory, TaskFactory, TrajectoryFactory
from .flywheel.test_authorization import FLYWHEEL_ROUTES
from .flywheel.test_demo_authorization import DEMO_ROUTES
from .quality.test_authorization import QUALITY_ROUTES
from .review.test_review_authz import PLAYER_ROUTES
from .review.test_review_queue_authz import REVIEW_ROUTES
from .webhooks.test_pages import WEBHOOK_ROUTES

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
EVERYONE = {A, L, M, S}
PUBLIC = {"anonymous", *EVERYONE}

# (url name, method, kind, roles allowed). kind "page" answers anonymous with a login redirect, "api" with 401.
MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("home", "get", "page", EVERYONE),
    ("healthz", "get", "public", PUBLIC),
    ("login", "get", "public", PUBLIC),
    ("logout", "post", "public", PUBLIC),
    ("annotate", "get", "page", {A, S}),
    ("annotate-next", "post", "page", {A, S}),
    ("annotate-unskip", "post", "page", {A, S}),
    ("live-start", "post", "page", {A, S}),
    # A live session is opened, watched and driven by its own annotator only (see tests/live/).
    ("live", "get", "page", set()),
    ("live-open", "post", "api", {A, S}),
    ("live-state", "get", "api", set()),
    ("live-step", "post", "api", set()),
    ("live-validate", "post", "api", set()),
    ("live-end", "post", "api", set()),
    ("live-retry", "post", "api", set()),
    ("live-vnc-token", "post", "api", set()),
    # Ground truth for simulated annotators' own sessions only: people get 403 (tests/simulated/).
    ("live-oracle-state", "get", "api", set()),
    ("insitu", "get", "page", {A, S}),
    ("insitu-token", "post", "page", {A, S}),
    ("insitu-browser-start", "post", "page", {A, S}),
    # A capture is seen and changed by its own annotator only (see tests/insitu/test_uploads.py).
    ("insitu-capture-page", "get", "page", set()),
    ("insitu-retry", "post", "page", set()),
    ("insitu-delete", "post", "page", set()),
    ("insitu-upload-start", "post", "api", {A, S}),
    ("insitu-upload", "get", "api", set()),
    ("insitu-upload", "put", "api", set()),
    ("insitu-capture", "get", "api", set()),
    ("insitu-capture", "delete", "api", set()),
    ("insitu-thought", "put", "api", set()),
    ("insitu-submit", "post", "api", set()),
    ("insitu-record", "post", "api", set()),
    ("insitu-finish", "post", "api", set()),
    ("insitu-vnc-token", "post", "api", set()),
    ("lead", "get", "page", {L, S}),
    ("lead-import", "post", "page", {L, S}),
    ("lead-stats", "get", "page", {L, S}),
    ("lead-trajectories", "get", "page", {L, M, S}),
    ("lead-task", "get", "page", {L, S}),
    ("lead-task-change", "post", "page", {L, S}),
    ("trajectory", "get", "page", EVERYONE),  # annotators: their own trajectories only (tested below)
    ("trajectory-review", "post", "page", {L, S}),
    # Fixing a rejected trajectory: its own annotator only (tests/test_resubmit.py).
    ("trajectory-fix", "post", "page", set()),
    ("trajectory-retry", "post", "page", set()),
    ("flywheel", "get", "page", {M, S}),
    ("flywheel-promote", "post", "page", {M, S}),
    ("media", "get", "media", EVERYONE),
    ("task-list", "get", "api", EVERYONE),
    ("task-list", "post", "api", {L, S}),
    ("task-detail", "get", "api", {L, M, S}),  # annotators see only tasks they hold
    ("task-detail", "patch", "api", {L, S}),
    ("task-detail", "delete", "api", {L, S}),
    ("task-import-file", "post", "api", {L, S}),
    ("queue-next", "post", "api", {A, S}),
    ("trajectory-list", "get", "api", EVERYONE),
    ("trajectory-list", "post", "api", {A, S}),
    ("trajectory-detail", "get", "api", {L, M, S}),  # the trajectory belongs to another annotator
    # Only the trajectory's own annotator changes it (superusers included in the refusal): see the test below.
    ("trajectory-add-step", "post", "api", set()),
    ("trajectory-add-recording", "post", "api", set()),
    ("trajectory-submit", "post", "api", set()),
    ("trajectory-add-review", "post", "api", {L, S}),
    ("modelversion-list", "get", "api", {M, S}),
    ("modelversion-list", "post", "api", {M, S}),
    ("modelversion-detail", "get", "api", {M, S}),
    ("modelversion-promote", "post", "api", {M, S}),
    ("me", "get", "api", EVERYONE),
    ("auth-token", "post", "public", PUBLIC),
    ("schema", "get", "api", EVERYONE),
    ("swagger-ui", "get", "api", EVERYONE),
    ("redoc", "get", "api", EVERYONE),
]


def _route_names(patterns, prefix: str = "") -> set[str]:
    names = set()
    for p in patterns:
        if isinstance(p, URLResolver):
            if p.namespace == "admin":  # Django's own admin: staff only, checked by Django
                continue
            names |= _route_names(p.url_patterns)
        elif isinstance(p, URLPattern) and p.name:
            names.add(p.name)
    return names


def test_every_route_is_in_the_matrix():
    routes = _route_names(get_resolver().url_patterns)
    covered = {name for name, *_ in MATRIX} | FLYWHEEL_ROUTES | REVIEW_ROUTES  # tests/flywheel/, tests/review/
    covered |= QUALITY_ROUTES  # tests/quality/test_authorization.py
    covered |= DEMO_ROUTES  # tests/flywheel/test_demo_authorization.py
    covered |= WEBHOOK_ROUTES  # tests/webhooks/test_pages.py
    covered |= PLAYER_ROUTES  # tests/review/test_review_authz.py
    covered |= AGREEMENT_ROUTES  # tests/agreement/test_authorization.py
    covered |= CURATION_ROUTES  # tests/curation/test_authorization.py
    assert routes - covered == set(), "add these routes to MATRIX"


@pytest.fixture
def objects(db):
    task = TaskFactory()
    trajectory = TrajectoryFactory(task=task, status=Trajectory.Status.SUBMITTED)
    step = StepFactory(trajectory=trajectory, index=0)
    step.screenshot.save("s.png", __import__("io").BytesIO(b"\x89PNG\r\n\x1a\n" + b"0" * 32), save=True)
    LiveSession.objects.create(
        trajectory=trajectory, status=LiveSession.Status.ACTIVE, model_width=100, model_height=80
    )
    capture = Capture.objects.create(
        annotator=trajectory.annotator, session_id=uuid.uuid4(), size=10, sha256="0" * 64, trajectory=trajectory
    )
    return {"task": task, "trajectory": trajectory, "model": ModelVersionFactory(), "step": step, "capture": capture}


def _url(name: str, objects) -> str:
    if name in {"task-detail", "lead-task", "lead-task-change"}:
        return reverse(name, args=[objects["task"].pk])
    if (name.startswith("trajectory-") and name not in {"trajectory-list"}) or name == "trajectory":
        return reverse(name, args=[objects["trajectory"].pk])
    if name.startswith("modelversion-") and name != "modelversion-list":
        return reverse(name, args=[objects["model"].pk])
    if name == "flywheel-promote":
        return reverse(name, args=[objects["model"].pk])
    if name.startswith("live") and name not in {"live-start", "live-open"}:
        return reverse(name, args=[objects["trajectory"].pk])
    if name == "insitu-thought":
        return reverse(name, args=[objects["capture"].pk, 0])
    if name.startswith("insitu-") and name not in {"insitu-token", "insitu-upload-start", "insitu-browser-start"}:
        return reverse(name, args=[objects["capture"].pk])
    if name == "media":
        return objects["step"].screenshot.url
    return reverse(name)


def _client(role: str, make_user):
    if role == "anonymous":
        return api_client_for(None), None
    user = make_user(role)
    client = api_client_for(user)
    client.force_login(user)  # pages use the session; the API accepts both
    return client, user


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method", "kind", "allowed"), MATRIX, ids=[f"{m} {n}" for n, m, *_ in MATRIX])
def test_authorization(role, name, method, kind, allowed, objects, make_user):
    client, _ = _client(role, make_user)
    url = _url(name, objects)
    response = getattr(client, method)(
        url, data={} if method != "get" else None, format="json" if kind == "api" else None
    )
    code = response.status_code
    assert code != 500
    if role in allowed:
        assert code not in (401, 403), f"{role} should reach {method} {url}, got {code}"
        if kind != "public":
            assert not (code == 302 and "/accounts/login/" in response.get("Location", "")), f"{role} sent to login"
    elif role == "anonymous":
        if kind == "page":
            assert code == 302 and response["Location"].startswith(reverse("login")), code
        else:
            assert code == 401, code
    elif kind == "media" or (name in {"task-detail", "trajectory-detail"} and method == "get"):
        assert code == 404, f"{role} must not learn that {url} exists, got {code}"
    else:
        assert code in (403, 404), f"{role} must not {method} {url}, got {code}"


def test_annotators_see_only_their_own_trajectories_and_tasks(make_user):
    me, other = make_user("annotator"), make_user("annotator")
    mine, theirs = TrajectoryFactory(annotator=me), TrajectoryFactory(annotator=other)
    client = api_client_for(me)
    listed = {t["id"] for t in client.get(reverse("trajectory-list")).json()["results"]}
    assert listed == {mine.pk}
    assert client.get(reverse("trajectory-detail", args=[theirs.pk])).status_code == 404
    client.force_login(me)
    assert client.get(reverse("trajectory", args=[theirs.pk])).status_code == 404
    assert client.get(reverse("trajectory", args=[mine.pk])).status_code == 200
    assert client.get(reverse("task-list")).json()["results"] == []
    assert Task.objects.count() == 2


def test_inactive_users_are_refused(make_user):
    user = make_user("data_lead", is_active=False)
    assert api_client_for(user).get(reverse("task-list")).status_code == 401


@pytest.mark.parametrize("name", ["trajectory-add-step", "trajectory-add-recording", "trajectory-submit"])
def test_owner_annotator_may_change_an_in_progress_trajectory(name, make_user):
    owner = make_user("annotator")
    trajectory = TrajectoryFactory(annotator=owner)
    response = api_client_for(owner).post(reverse(name, args=[trajectory.pk]), {}, format="multipart")
    assert response.status_code == 400  # past the permission check, stopped by validation of the empty body
    trajectory.status = Trajectory.Status.SUBMITTED
    trajectory.save()
    assert api_client_for(owner).post(reverse(name, args=[trajectory.pk]), {}).status_code == 403


@pytest.mark.parametrize(
    ("name", "method", "body", "expected"),
    [
        ("live", "get", None, 200),
        ("live-state", "get", None, 200),
        ("live-validate", "post", {"action_text": "wait()"}, 200),
        ("live-step", "post", {}, 400),
        ("live-vnc-token", "post", {}, 503),  # past the permission check; no sandbox service runs in this test
        ("live-end", "post", {}, 200),
    ],
)
def test_the_owner_gets_into_their_live_session(name, method, body, expected, make_user, settings):
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # nothing listens: errors must come back as clear 503s
    owner = make_user("annotator")
    trajectory = TrajectoryFactory(annotator=owner, mode=Trajectory.Mode.INTERACTIVE)
    LiveSession.objects.create(
        trajectory=trajectory, status=LiveSession.Status.ACTIVE, model_width=100, model_height=80
    )
    client = api_client_for(owner)
    client.force_login(owner)
    response = getattr(client, method)(
        reverse(name, args=[trajectory.pk]), body, format="json" if body is not None else None
    )
    assert response.status_code == expected, response.content[:300]
    if expected == 503:
        assert "did not answer" in response.json()["detail"]


def _admin_models():
    from django.contrib import admin

    return sorted(f"{m._meta.app_label}_{m._meta.model_name}" for m in admin.site._registry)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("model", _admin_models())
def test_admin_is_for_staff_only(role, model, objects, make_user):
    client, _ = _client(role, make_user)
    for page in ("changelist", "add"):
        response = client.get(reverse(f"admin:{model}_{page}"))
        if role == "superuser":
            assert response.status_code == 200, f"admin {model} {page}"
        else:
            assert response.status_code == 302 and "/admin/login/" in response["Location"]
