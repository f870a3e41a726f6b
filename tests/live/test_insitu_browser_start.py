"""Starting a browser think-aloud capture: the request only creates the capture and queues its desktop; a Celery task
(`annotation_app.live.start_capture`) leases and sets it up on the real sandbox service, idempotently, and fails
cleanly. The page and the API wait for it. The whole flow in Chromium is in test_insitu_browser.py."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.urls import reverse

from annotation_app import tasks
from annotation_app.insitu import browser
from annotation_app.insitu.timeline import delete_capture
from annotation_app.models import Capture
from sandbox.client import SessionGoneError

from ..conftest import api_client_for
from ..factories import AssignmentFactory
from .conftest import needs_desktop

SETUP = [{"type": "sleep", "parameters": {"seconds": 0}}]


@pytest.fixture
def held(db):
    """An annotator holding a task with a setup, logged in to the pages and the API."""
    assignment = AssignmentFactory(task__setup_config=SETUP)
    client = api_client_for(assignment.annotator)
    client.force_login(assignment.annotator)
    return assignment, client


def leased(capture: Capture, session_id: str) -> bool:
    """Whether the sandbox service still holds this desktop for the capture (a renewal is answered)."""
    client = browser.sandbox_for(capture)
    try:
        client.renew(session_id, 60)
        return True
    except SessionGoneError:
        return False
    finally:
        client.close()


def started(capture: Capture) -> Capture:
    tasks.start_capture(capture.pk)
    capture.refresh_from_db()
    return capture


def test_the_request_only_queues_the_desktop(held, django_capture_on_commit_callbacks):
    assignment, client = held
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("insitu-browser-start"))
    capture = Capture.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("insitu-capture-page", args=[capture.pk])
    assert len(callbacks) == 1  # the start is queued once the capture is committed; nothing is leased in the request
    assert (capture.source, capture.status, capture.stage) == ("browser", "recording", "starting the desktop")
    assert capture.task == assignment.task and capture.meta == {}
    # routed to the live queue (its workers lease desktops), by the annotation_app.live.* prefix
    assert tasks.start_capture.name == "annotation_app.live.start_capture"
    from annotation_app.celery import app

    assert app.amqp.router.route({}, tasks.start_capture.name)["queue"].name == "live"


def test_vnc_token_record_and_finish_answer_409_while_the_desktop_starts(held):
    assignment, client = held
    capture = browser.open_browser_capture(assignment.annotator)
    for name in ("insitu-vnc-token", "insitu-record", "insitu-finish"):
        response = client.post(reverse(name, args=[capture.pk]), {}, format="multipart")
        assert response.status_code == 409, (name, response.content)
        assert "still starting" in response.json()["detail"], name


def test_a_capture_still_starting_can_be_deleted(held):
    assignment, _ = held
    delete_capture(browser.open_browser_capture(assignment.annotator))  # no desktop yet: nothing to release
    assert not Capture.objects.exists()


def test_an_unreachable_sandbox_fails_the_capture_clearly(held, settings):
    assignment, client = held
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # nobody listens there
    capture = started(browser.open_browser_capture(assignment.annotator))
    assert (capture.status, capture.stage) == ("failed", "failed")
    assert capture.error.startswith("The sandbox could not be prepared: the sandbox service did not answer")
    url = reverse("insitu-capture-page", args=[capture.pk])
    assert client.get(url, headers={"HX-Request": "true"})["HX-Refresh"] == "true"
    page = client.get(url).content.decode()
    assert "The sandbox could not be prepared" in page and "Process again" not in page  # nothing to process
    assert client.post(reverse("insitu-record", args=[capture.pk])).status_code == 409


@needs_desktop
def test_the_page_waits_for_the_desktop_then_reloads(held, live_settings):
    assignment, client = held
    capture = browser.open_browser_capture(assignment.annotator)
    url = reverse("insitu-capture-page", args=[capture.pk])
    page = client.get(url).content.decode()
    assert "starting the desktop…" in page and 'data-ready=""' in page
    assert '<button id="record" disabled>' in page and 'hx-trigger="every 1s"' in page
    poll = client.get(url, headers={"HX-Request": "true"})
    assert "HX-Refresh" not in poll and "starting the desktop" in poll.content.decode()
    capture = started(capture)
    try:
        poll = client.get(url, headers={"HX-Request": "true"})
        assert poll["HX-Refresh"] == "true"  # ready: the whole page reloads and connects to the desktop
        page = client.get(url).content.decode()
        assert 'data-ready="1"' in page and 'id="record" disabled' not in page and "ready to record" in page
        assert 'hx-trigger="every 1s"' not in page
    finally:
        browser.abandon(capture)
    assert not leased(capture, capture.meta["sandbox_session"])


@needs_desktop
def test_the_desktop_starts_once_and_a_retried_delivery_does_nothing(held, live_settings):
    assignment, _ = held
    capture = started(browser.open_browser_capture(assignment.annotator))
    session = capture.meta["sandbox_session"]
    try:
        assert (capture.status, capture.stage) == ("recording", "ready to record") and leased(capture, session)
        tasks.start_capture(capture.pk)  # acks_late: the same message again
        tasks.start_capture(capture.pk + 1000)  # a capture deleted since
        capture.refresh_from_db()
        assert (capture.stage, capture.meta) == ("ready to record", {"sandbox_session": session})
        assert leased(capture, session)
    finally:
        browser.abandon(capture)


@needs_desktop
def test_a_delivery_that_died_midway_is_started_over(held, live_settings):
    """The worker died between the lease and the end of setup: the redelivery gives that lease back first."""
    assignment, _ = held
    capture = browser.open_browser_capture(assignment.annotator)
    client = browser.sandbox_for(capture)
    first = client.allocate(ttl_s=60)["session_id"]
    client.close()
    Capture.objects.filter(pk=capture.pk).update(meta={"sandbox_session": first})
    capture = started(capture)
    try:
        assert capture.stage == "ready to record" and capture.meta["sandbox_session"] != first
        assert not leased(capture, first) and leased(capture, capture.meta["sandbox_session"])
    finally:
        browser.abandon(capture)


@needs_desktop
def test_a_failed_setup_releases_the_lease(held, live_settings):
    assignment, _ = held
    assignment.task.setup_config = [{"type": "execute", "parameters": {"command": "false"}}]
    assignment.task.save()
    capture = started(browser.open_browser_capture(assignment.annotator))
    assert capture.status == "failed" and capture.error.startswith("The sandbox could not be prepared: config[0]")
    session = capture.meta["sandbox_session"]
    assert not leased(capture, session)
    tasks.start_capture(capture.pk)  # redelivered: nothing more
    capture.refresh_from_db()
    assert capture.status == "failed" and capture.meta["sandbox_session"] == session


@needs_desktop
@pytest.mark.django_db(transaction=True)
def test_a_capture_cancelled_while_its_desktop_starts_gets_no_desktop(held, live_settings):
    """The annotator deletes the capture during the setup: the task gives back the lease it took and marks nothing."""
    assignment, client = held
    assignment.task.setup_config = [{"type": "sleep", "parameters": {"seconds": 2}}]
    assignment.task.save()
    capture = browser.open_browser_capture(assignment.annotator)

    def deliver() -> None:  # as a worker would, on a connection of its own
        try:
            tasks.start_capture(capture.pk)
        finally:
            connection.close()

    worker = threading.Thread(target=deliver)
    worker.start()
    deadline = time.monotonic() + 30
    while not Capture.objects.get(pk=capture.pk).meta.get("sandbox_session") and time.monotonic() < deadline:
        time.sleep(0.05)
    session = Capture.objects.get(pk=capture.pk).meta["sandbox_session"]  # leased, setup running
    assert client.post(reverse("insitu-delete", args=[capture.pk])).status_code == 302
    worker.join(30)
    assert not worker.is_alive() and not Capture.objects.filter(pk=capture.pk).exists()
    assert not leased(capture, session)
