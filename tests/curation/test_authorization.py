"""Every curation route for every role: data leads and ML engineers read the curation page and its runs; data leads
(and superusers) start verifications and deduplication; annotators and anonymous users get nothing.
tests/test_authorization.py takes these names as covered."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ..access import assert_answer, client_as, reach
from ..conftest import ROLES

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
    url = reverse(name)
    response = reach(client_as(role, make_user), method, url, kind)
    assert_answer(response, role, allowed, kind, method, url)
