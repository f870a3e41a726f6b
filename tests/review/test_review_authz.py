"""The trajectory player and its step endpoints for every role: data leads (and superusers) judge and edit steps;
ML engineers see the player read-only; annotators never open it, not even for their own trajectory (they have
/trajectories/<id>/). tests/test_authorization.py takes PLAYER_ROUTES as covered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from annotation_app.models import Role, StepEdit, Trajectory

from ..conftest import ROLES, api_client_for
from ..factories import StepFactory, TrajectoryFactory

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
LEADS = {L, S}

# (url name, method, kind, roles allowed, what an allowed role posts). "page" answers anonymous with a login
# redirect, "json" with 401.
PLAYER_MATRIX: list[tuple[str, str, str, set[str], dict[str, str]]] = [
    ("lead-trajectory", "get", "page", {L, M, S}, {}),
    ("lead-step-verdict", "post", "json", LEADS, {"verdict": "ok"}),
    ("lead-step-edit", "post", "json", LEADS, {"field": "thought", "value": "A better thought."}),
    ("lead-step-check", "post", "json", LEADS, {"action": "click(start_box='(5,5)')"}),
    ("lead-step-cut", "post", "json", LEADS, {}),
    ("lead-step-restore", "post", "json", LEADS, {}),
]
PLAYER_ROUTES = {name for name, *_ in PLAYER_MATRIX}


@pytest.fixture
def trajectory(db):
    trajectory = TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    for i in range(3):
        StepFactory(trajectory=trajectory, index=i)
    return trajectory


def _url(name: str, trajectory: Trajectory) -> str:
    if name == "lead-trajectory":
        return reverse(name, args=[trajectory.pk])
    return reverse(name, args=[trajectory.pk, 1])


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("name", "method", "kind", "allowed", "body"), PLAYER_MATRIX, ids=[f"{m} {n}" for n, m, *_ in PLAYER_MATRIX]
)
def test_authorization(role, name, method, kind, allowed, body, trajectory, make_user):
    client = api_client_for(None)
    if role != "anonymous":
        user = make_user(role)
        client.force_login(user)
    if name == "lead-step-restore":
        trajectory.steps.filter(index__gte=1).update(status="cut")
    url = _url(name, trajectory)
    response = client.get(url) if method == "get" else client.post(url, body)
    code = response.status_code
    assert code != 500
    if role in allowed:
        assert code == 200, f"{role} should reach {method} {url}, got {code}"
    elif role == "anonymous":
        if kind == "page":
            assert code == 302 and response["Location"].startswith(reverse("login")), code
        else:
            assert code == 401 and response.json()["detail"], code
    else:
        assert code == 403, f"{role} must not {method} {url}, got {code}"
    changed = StepEdit.objects.exists() or trajectory.steps.filter(verdicts__isnull=False).exists()
    assert changed == (role in allowed and name in {"lead-step-verdict", "lead-step-edit", "lead-step-cut",
                                                    "lead-step-restore"})  # fmt: skip


def test_an_ml_engineer_sees_the_player_read_only_and_an_annotator_not_even_their_own(client, make_user, trajectory):
    engineer = make_user(Role.ML_ENGINEER)
    client.force_login(engineer)
    page = client.get(reverse("lead-trajectory", args=[trajectory.pk]))
    assert page.status_code == 200
    assert b'id="player-edit"' not in page.content and b"Read-only" in page.content
    lead = make_user(Role.DATA_LEAD)
    client.force_login(lead)
    page = client.get(reverse("lead-trajectory", args=[trajectory.pk]))
    assert b'id="player-edit"' in page.content
    assert client.get(reverse("lead-trajectory", args=[trajectory.pk + 1000])).status_code == 404
    client.force_login(trajectory.annotator)
    assert client.get(reverse("lead-trajectory", args=[trajectory.pk])).status_code == 403
    assert client.post(reverse("lead-step-check", args=[trajectory.pk, 0]), {"action": "wait()"}).status_code == 403
