"""Every curation route for every role: data leads and ML engineers read the curation page and its runs; data leads
(and superusers) start verifications and deduplication; annotators and anonymous users get nothing.
tests/test_authorization.py takes these names as covered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ..conftest import ROLES, api_client_for

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"

# (url name, method, kind, roles allowed)
CURATION_MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("curation", "get", "page", {L, M, S}),
    ("curation-runs", "get", "page", {L, M, S}),
    ("curation-verify", "post", "page", {L, S}),
    ("curation-dedup", "post", "page", {L, S}),
]
CURATION_ROUTES = {name for name, *_ in CURATION_MATRIX}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("name", "method", "kind", "allowed"), CURATION_MATRIX, ids=[f"{m} {n}" for n, m, *_ in CURATION_MATRIX]
)
def test_authorization(role, name, method, kind, allowed, make_user, db):
    client = api_client_for(None)
    if role != "anonymous":
        user = make_user(role)
        client = api_client_for(user)
        client.force_login(user)
    url = reverse(name)
    response = getattr(client, method)(url, data={} if method != "get" else None)
    code = response.status_code
    assert code != 500
    if role in allowed:
        assert code not in (401, 403), f"{role} should reach {method} {url}, got {code}"
        assert not (code == 302 and "/accounts/login/" in response.get("Location", ""))
    elif role == "anonymous":
        assert code == 302 and response["Location"].startswith(reverse("login")), code
    else:
        assert code in (403, 404), f"{role} must not {method} {url}, got {code}"
