"""Starting a browser think-aloud capture: the request only creates the capture and queues its desktop; a Celery task
(`annotation_app.live.start_capture`) leases and sets it up on the real sandbox service, idempotently, and fails
cleanly. The page and the API wait for it, up to CAPTURE_START_TIMEOUT_S. Starting the same task again resumes the
open capture (one desktop, even for concurrent requests) unless its lease is gone. The whole flow in Chromium is in
test_insitu_browser.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from annotation_app import tasks
from annotation_app.insitu import browser
from annotation_app.insitu.timeline import delete_capture
from annotation_app.models import Assignment, Capture
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


def start_in_background(capture: Capture) -> tuple[threading.Thread, str]:
    """Deliver the capture's start task in a thread, as a worker would (on a connection of its own), and wait until
    it has leased the desktop; the thread (still running the task's setup) and the leased session."""

    def deliver() -> None:
        try:
            tasks.start_capture(capture.pk)
        finally:
            connection.close()

    worker = threading.Thread(target=deliver)
    worker.start()
    deadline = time.monotonic() + 30
    while not Capture.objects.get(pk=capture.pk).meta.get("sandbox_session") and time.monotonic() < deadline:
        time.sleep(0.05)
    return worker, Capture.objects.get(pk=capture.pk).meta["sandbox_session"]


def started(capture: Capture) -> Capture:
    tasks.start_capture(capture.pk)
    capture.refresh_from_db()
    return capture


def page_of(capture: Capture) -> str:
    return reverse("insitu-capture-page", args=[capture.pk])


def overdue(capture: Capture, settings) -> None:
    """The capture was created longer than CAPTURE_START_TIMEOUT_S ago."""
    then = timezone.now() - timedelta(seconds=settings.CAPTURE_START_TIMEOUT_S + 1)
    Capture.objects.filter(pk=capture.pk).update(created_at=then)


@pytest.fixture
def eager():
    """Celery runs `start_capture.delay` at once, in the caller's thread (as a worker would, on the real sandbox
    service), instead of queueing it in the broker that other test runs' workers share."""
    from annotation_app.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


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

    worker, session = start_in_background(capture)  # leased, setup running
    assert client.post(reverse("insitu-delete", args=[capture.pk])).status_code == 302
    worker.join(30)
    assert not worker.is_alive() and not Capture.objects.filter(pk=capture.pk).exists()
    assert not leased(capture, session)


# --- starting the same task again -------------------------------------------------------------------------------------


@needs_desktop
def test_a_second_start_resumes_the_open_capture_and_leases_nothing_more(
    held, live_settings, django_capture_on_commit_callbacks
):
    _, client = held
    url = reverse("insitu-browser-start")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        first, second = client.post(url), client.post(url)  # a double submit, before a worker took the first
    capture = Capture.objects.get()
    assert first["Location"] == second["Location"] == page_of(capture)
    assert len(callbacks) == 1  # one desktop queued, not two
    capture = started(capture)
    session = capture.meta["sandbox_session"]
    try:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            again = client.post(url)  # back to the task once its desktop is ready
        assert again["Location"] == page_of(capture) and callbacks == [] and Capture.objects.count() == 1
        capture.refresh_from_db()
        assert (capture.status, capture.stage, capture.meta) == (
            "recording",
            "ready to record",
            {"sandbox_session": session},
        )
        assert leased(capture, session)
    finally:
        browser.abandon(capture)
    # once it is recording (or over) the next start is a capture of its own
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        other = client.post(url)
    assert Capture.objects.count() == 2 and other["Location"] != page_of(capture) and len(callbacks) == 1


@needs_desktop
@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_make_one_capture_and_one_desktop(held, live_settings, eager):
    """Both requests are held at the assignment's lock, then let go together: the second finds the first's capture."""
    assignment, client = held
    other = api_client_for(assignment.annotator)
    other.force_login(assignment.annotator)
    answers: list[str] = []

    def start(client) -> None:  # a request on a connection of its own, as in a server thread
        try:
            answers.append(client.post(reverse("insitu-browser-start"))["Location"])
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(c,)) for c in (client, other)]
    with transaction.atomic():
        Assignment.objects.select_for_update().get(pk=assignment.pk)
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while waiting_for_a_lock() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting_for_a_lock() == 2  # both got past looking for an open capture: the lock alone decides
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    capture = Capture.objects.get()  # one capture
    try:
        assert answers == [page_of(capture)] * 2
        # its desktop was started once (eagerly, by the request that created it) and is held
        assert (capture.status, capture.stage) == ("recording", "ready to record"), capture.error
        assert leased(capture, capture.meta["sandbox_session"])
    finally:
        browser.abandon(capture)


def waiting_for_a_lock() -> int:
    """Connections of this database waiting for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@needs_desktop
def test_a_capture_whose_lease_is_gone_is_not_resumed(held, live_settings, django_capture_on_commit_callbacks):
    assignment, client = held
    capture = started(browser.open_browser_capture(assignment.annotator))
    session = capture.meta["sandbox_session"]
    owner = browser.sandbox_for(capture)
    owner.renew(session, 0.2)  # the lease runs out, as when the annotator left the page for longer than its TTL
    time.sleep(0.5)
    assert not leased(capture, session)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("insitu-browser-start"))
    new = Capture.objects.exclude(pk=capture.pk).get()
    assert response["Location"] == page_of(new) and len(callbacks) == 1
    assert (new.status, new.stage) == ("recording", "starting the desktop")
    capture.refresh_from_db()
    assert (capture.status, capture.stage, capture.error) == ("failed", "failed", browser.LEASE_GONE)
    assert browser.LEASE_GONE in client.get(page_of(capture)).content.decode()


def test_a_sandbox_service_that_does_not_answer_leaves_the_open_capture_be(held, settings):
    """The lease may well outlive an outage of the service: the capture is resumed, as a live session is."""
    assignment, client = held
    capture = browser.open_browser_capture(assignment.annotator)
    Capture.objects.filter(pk=capture.pk).update(stage="ready to record", meta={"sandbox_session": "s-1"})
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # nobody listens there
    assert client.post(reverse("insitu-browser-start"))["Location"] == page_of(capture)
    capture.refresh_from_db()
    assert Capture.objects.count() == 1 and capture.status == "recording"


# --- a desktop that does not start ------------------------------------------------------------------------------------


@needs_desktop
def test_a_desktop_that_does_not_start_in_time_fails_and_a_late_delivery_leases_nothing(
    held, live_settings, settings, django_capture_on_commit_callbacks
):
    """No worker took the start: the status poll fails the capture; the message that comes later does nothing."""
    assignment, client = held
    capture = browser.open_browser_capture(assignment.annotator)
    assert "HX-Refresh" not in client.get(page_of(capture), headers={"HX-Request": "true"})  # still in time
    overdue(capture, settings)
    poll = client.get(page_of(capture), headers={"HX-Request": "true"})
    assert poll["HX-Refresh"] == "true"  # the page reloads to show why
    capture.refresh_from_db()
    message = "The desktop did not start within 120 s; is a worker running on the live queue?"
    assert (capture.status, capture.stage, capture.error) == ("failed", "failed", message)
    page = client.get(page_of(capture)).content.decode()
    assert message in page and "Back to Think-aloud" in page and 'hx-trigger="every 1s"' not in page
    tasks.start_capture(capture.pk)  # the worker comes up at last
    capture.refresh_from_db()
    assert (capture.status, capture.error, capture.meta) == ("failed", message, {})  # nothing leased
    # starting again makes a new capture, not this one
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("insitu-browser-start"))
    new = Capture.objects.exclude(pk=capture.pk).get()
    assert response["Location"] == page_of(new) and len(callbacks) == 1 and new.stage == "starting the desktop"


def test_an_overdue_start_is_not_resumed_and_the_api_reports_it(held, settings):
    assignment, client = held
    settings.CAPTURE_START_TIMEOUT_S = 5
    capture = browser.open_browser_capture(assignment.annotator)
    overdue(capture, settings)
    state = client.get(reverse("insitu-upload", args=[capture.pk])).json()
    assert (state["status"], state["error"]) == (
        "failed",
        "The desktop did not start within 5 s; is a worker running on the live queue?",
    )
    other = browser.open_browser_capture(assignment.annotator)
    assert other.pk != capture.pk and other.stage == "starting the desktop"
    overdue(other, settings)
    assert client.get(reverse("insitu")).status_code == 200  # the list of captures fails it too
    other.refresh_from_db()
    assert other.status == "failed"


@needs_desktop
@pytest.mark.django_db(transaction=True)
def test_a_start_that_times_out_during_the_setup_gives_its_lease_back(held, live_settings, settings):
    """A worker took the start but the setup is still running at the timeout: the poll fails the capture and gives
    the lease back; the worker, finding the capture no longer starting, keeps nothing."""
    assignment, client = held
    assignment.task.setup_config = [{"type": "sleep", "parameters": {"seconds": 2}}]
    assignment.task.save()
    capture = browser.open_browser_capture(assignment.annotator)

    worker, session = start_in_background(capture)  # leased, setup running
    overdue(capture, settings)
    assert client.get(page_of(capture), headers={"HX-Request": "true"})["HX-Refresh"] == "true"
    worker.join(30)
    assert not worker.is_alive()
    capture.refresh_from_db()
    message = "The desktop did not start within 120 s: the task's setup was still running."
    assert (capture.status, capture.stage, capture.error) == ("failed", "failed", message)
    assert not leased(capture, session)
