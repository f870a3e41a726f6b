"""Every quality route for every role: data leads and ML engineers read the dashboards and may refresh them;
annotators get 403 (they never see other annotators' figures) and anonymous users go to the login page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ..conftest import ROLES, api_client_for

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
READERS = {L, M, S}

# (url name, method, url args, roles allowed); tests/test_authorization.py takes these names as covered.
QUALITY_MATRIX: list[tuple[str, str, list, set[str]]] = [
    ("quality", "get", [], READERS),
    ("quality-refresh", "post", [], READERS),
    ("quality-acceptance", "get", [], READERS),
    ("quality-csv", "get", ["annotators"], READERS),
]
QUALITY_ROUTES = {name for name, *_ in QUALITY_MATRIX}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method", "args", "allowed"), QUALITY_MATRIX, ids=[n for n, *_ in QUALITY_MATRIX])
def test_authorization(role, name, method, args, allowed, make_user):
    client = api_client_for(None)
    if role != "anonymous":
        client.force_login(make_user(role))
    url = reverse(name, args=args)
    response = getattr(client, method)(url)  # the refresh goes to the real broker; no worker takes it here
    code = response.status_code
    if role in allowed:
        assert code == 200, f"{role} should reach {method} {url}, got {code}"
    elif role == "anonymous":
        assert code == 302 and response["Location"].startswith(reverse("login")), code
    else:
        assert code == 403, f"{role} must not {method} {url}, got {code}"
