"""Security defaults (issue 13 §6): no public superuser in production, throttled password checks, capture quota."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import uuid

import pytest
from django.urls import reverse

from annotation_app.insitu.timeline import delete_capture
from annotation_app.models import Capture, Role, User

from .conftest import api_client_for
from .factories import UserFactory
from .servers import ROOT, subprocess_env


def fresh_address() -> str:
    """A client address no earlier test (or run, within the throttles' windows) has used: the counters live in Redis."""
    return f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"


def test_seed_demo_refuses_production(transactional_db):
    env = subprocess_env(
        DJANGO_ENV="production",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="a-production-secret-key-for-this-test-only-0123456789",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "seed_demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "refused with DJANGO_ENV=production" in done.stderr, done.stderr
    assert not User.objects.filter(username="admin").exists()


def test_the_token_endpoint_is_throttled_per_address_and_username(db):
    UserFactory(username="tok-user")
    UserFactory(username="tok-other")
    client = api_client_for(None)
    address = fresh_address()
    url = reverse("auth-token")

    def ask(username: str, password: str, **headers: str):
        return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address, **headers)

    for _ in range(10):  # AUTH_TOKEN_RATE, 10/min
        assert ask("tok-user", "wrong").status_code == 400
    refused = ask("tok-user", "pw")  # even the right password, until the minute is over
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("Too many token requests for this account from your address.")
    assert "Expected available in" in refused.json()["detail"]
    # A forged X-Forwarded-For does not make a new client (NUM_PROXIES is 0: the peer address counts).
    assert ask("tok-user", "pw", HTTP_X_FORWARDED_FOR=fresh_address()).status_code == 429
    # Another account from the same address is not locked out by the first one's failures.
    assert ask("tok-other", "pw").status_code == 200 and ask("tok-other", "pw").json()["token"]


def test_the_login_page_refuses_after_repeated_failures(client, settings, db):
    settings.LOGIN_FAILURES_ALLOWED = 3
    UserFactory(username="login-user")
    UserFactory(username="login-other")
    address = fresh_address()
    url = reverse("login")

    def log_in(username: str, password: str):
        return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)

    for _ in range(3):
        failed = log_in("login-user", "wrong")
        assert failed.status_code == 200 and b"didn't match" in failed.content
    refused = log_in("login-user", "pw")  # the right password is not even checked now
    assert refused.status_code == 429
    assert re.search(rb"Too many failed log-ins from your address; try again in \d+ minutes?\.", refused.content)
    assert "_auth_user_id" not in client.session
    # Successful log-ins never count, and another account from the address still logs in.
    for _ in range(5):
        assert log_in("login-other", "pw").status_code == 302
        client.logout()


def test_the_address_limit_covers_many_usernames(client, settings, db):
    settings.LOGIN_FAILURES_ALLOWED = 1  # so 10 failures per address, over any usernames
    address = fresh_address()
    for i in range(10):
        response = client.post(reverse("login"), {"username": f"guess-{i}", "password": "x"}, REMOTE_ADDR=address)
        assert response.status_code == 200
    response = client.post(reverse("login"), {"username": "guess-new", "password": "x"}, REMOTE_ADDR=address)
    assert response.status_code == 429


@pytest.fixture
def quota(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    settings.MAX_USER_CAPTURE_BYTES = 1000
    return settings.MAX_USER_CAPTURE_BYTES


def start(api, size: int):
    body = {"session_id": str(uuid.uuid4()), "size": size, "sha256": "a" * 64, "instruction": "free-form"}
    return api.post("/api/insitu/uploads/", body, format="json")


def test_capture_uploads_stop_at_the_users_quota(quota, make_user):
    me = make_user(Role.ANNOTATOR)
    api = api_client_for(me)
    first = start(api, 600)
    assert first.status_code == 201
    refused = start(api, 600)
    assert refused.status_code == 413
    assert refused.json()["detail"].startswith("This capture (0.0 MiB) would take your captures past your quota")
    assert "Delete captures you no longer need" in refused.json()["detail"]
    assert start(api, 400).status_code == 201  # exactly up to the quota is fine
    assert Capture.objects.filter(annotator=me).count() == 2
    # Other annotators have quotas of their own; deleting a capture gives its space back.
    assert start(api_client_for(make_user(Role.ANNOTATOR)), 1000).status_code == 201
    delete_capture(Capture.objects.get(pk=first.json()["id"]))
    assert start(api, 600).status_code == 201
