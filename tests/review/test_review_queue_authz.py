"""Every review-queue, verdict and project-settings route for every role: data leads (and superusers) only; nobody
reviews their own trajectory. tests/test_authorization.py takes REVIEW_ROUTES as covered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.models import Trajectory

from ..access import assert_answer, client_as, reach
from ..conftest import ROLES, api_client_for
from ..factories import TaskFactory, TrajectoryFactory

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
LEADS = {L, S}

# (url name, method, kind, roles allowed)
REVIEW_MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("lead-trajectory-verdict", "get", "page", LEADS),
    ("lead-trajectory-verdict", "post", "page", LEADS),
    ("lead-review-queue", "get", "page", LEADS),
    ("lead-review-next", "post", "page", LEADS),
    ("lead-review-release", "post", "page", LEADS),
    ("lead-projects", "get", "page", LEADS),
    ("lead-projects", "post", "page", LEADS),
    ("review-queue", "get", "api", LEADS),
    ("review-next", "post", "api", LEADS),
    ("review-verdict", "get", "api", LEADS),
    ("review-verdict", "post", "api", LEADS),
]
REVIEW_ROUTES = {name for name, *_ in REVIEW_MATRIX}


@pytest.fixture
def trajectory(db):
    return TrajectoryFactory(task=TaskFactory(), status=Trajectory.Status.SUBMITTED)


def _url(name: str, trajectory: Trajectory) -> str:
    if name in {"lead-trajectory-verdict", "review-verdict"}:
        return reverse(name, args=[trajectory.pk])
    return reverse(name)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("name", "method", "kind", "allowed"), REVIEW_MATRIX, ids=[f"{m} {n}" for n, m, *_ in REVIEW_MATRIX]
)
def test_authorization(role, name, method, kind, allowed, trajectory, make_user):
    url = _url(name, trajectory)
    response = reach(client_as(role, make_user), method, url, kind)
    assert_answer(response, role, allowed, kind, method, url)


@pytest.mark.django_db
def test_nobody_reviews_their_own_trajectory(make_user):
    boss = make_user("superuser")
    own = TrajectoryFactory(annotator=boss, status=Trajectory.Status.SUBMITTED)
    client = api_client_for(boss)
    client.force_login(boss)
    url = reverse("lead-trajectory-verdict", args=[own.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"verdict": "approve"}).status_code == 403
    api_url = reverse("review-verdict", args=[own.pk])
    assert client.get(api_url).status_code == 403
    assert client.post(api_url, {"verdict": "approve", "scores": {}}, format="json").status_code == 403
