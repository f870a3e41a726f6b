"""Shared fixtures: one user per role and API clients authenticated with their tokens."""

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
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


OUR_PROGRAMS = {"Xvfb", "x11vnc", "openbox", "xterm", "gunicorn", "daphne", "celery", "chromium"}


def _our_processes() -> set[tuple[int, str]]:
    """Live processes running one of the programs the tests start (matched on the command line's first words)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")[:3]
        except OSError:
            continue
        names = {Path(w.decode(errors="replace")).name for w in words if w}
        if names & OUR_PROGRAMS:
            found.add((int(cmdline.parent.name), " ".join(sorted(names & OUR_PROGRAMS))))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """After the whole suite, no desktop, server or browser a test started may still run."""
    before = _our_processes()
    yield
    deadline = time.monotonic() + 10
    while (left := _our_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left running after the tests: {sorted(left)}"


@contextmanager
def celery_worker(log: Path, **env: str) -> Iterator[Path]:
    """A `celery worker` subprocess consuming every queue, pointed at pytest's test database; `env` adds to its
    environment (e.g. the sandbox service a test started). Yields its log."""
    from annotation_app.celery import app

    from .servers import running, subprocess_env

    command = [sys.executable, "-m", "celery", "-A", "annotation_app", "worker", "--pool", "solo", "--loglevel", "INFO"]
    command += ["-Q", ",".join(settings.CELERY_QUEUES), "--without-gossip", "--without-mingle"]
    command += ["-n", f"test-{os.getpid()}@%h"]
    app.control.purge()
    with running(command, subprocess_env(**env), log, lambda: bool(app.control.ping(timeout=0.5))):
        yield log


@pytest.fixture
def worker(transactional_db, tmp_path):
    """A `celery worker` subprocess consuming every queue, pointed at pytest's test database."""
    with celery_worker(tmp_path / "worker.log") as log:
        yield log


@pytest.fixture
def media(settings, tmp_path):
    """Uploaded and generated files of one test under its own temporary MEDIA_ROOT."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT
