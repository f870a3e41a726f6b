"""Shared fixtures: one user per role and API clients authenticated with their tokens."""

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation_app.models import Role

from .factories import UserFactory

ROLES = ["anonymous", Role.ANNOTATOR, Role.DATA_LEAD, Role.ML_ENGINEER, "superuser"]


@pytest.fixture
def make_user(db):
    def make(role: str = Role.ANNOTATOR, **kwargs):
        if role == "superuser":
            return UserFactory(role=Role.DATA_LEAD, is_superuser=True, is_staff=True, **kwargs)
        return UserFactory(role=role, **kwargs)

    return make


@pytest.fixture
def annotator(make_user):
    return make_user(Role.ANNOTATOR)


@pytest.fixture
def lead(make_user):
    return make_user(Role.DATA_LEAD)


@pytest.fixture
def engineer(make_user):
    return make_user(Role.ML_ENGINEER)


def api_client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api(annotator):
    return api_client_for(annotator)


@pytest.fixture
def lead_api(lead):
    return api_client_for(lead)
