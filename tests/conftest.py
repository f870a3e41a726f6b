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
from .processes import Proc, ProcessWatch, mark_this_run

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


RUN_MARK_VALUE = mark_this_run()  # before any test starts a process: every child inherits it


def left_behind(watch: ProcessWatch, grace: float = 10.0) -> list[Proc]:
    """The processes of this run still running after `grace` seconds (servers get a moment to exit)."""
    deadline = time.monotonic() + grace
    while (left := watch.leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """After the whole suite, no process this run started (desktop, server, browser, shell) may still run. Only this
    run's processes count (tests/processes.py): a `scripts/run` or another test run beside it is not a leak."""
    watch = ProcessWatch(RUN_MARK_VALUE, os.getpid()).start()
    yield
    watch.stop()
    left = left_behind(watch)
    assert not left, "processes left running after the tests:\n" + "\n".join(f"{p.pid} {p.command}" for p in left)


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
