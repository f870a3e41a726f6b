"""The resumable upload protocol (docs/in-situ.md) against the real app and database, and who may do what."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from annotation_app.models import Capture

from ..conftest import api_client_for
from ..factories import AssignmentFactory
from .captures import sha256

DATA = bytes(range(256)) * 1000  # 256,000 bytes


def put(client, capture_id: int, start: int, part: bytes, *, total: int = len(DATA), digest: str | None = None):
    return client.put(
        f"/api/insitu/uploads/{capture_id}/",
        data=part,
        content_type="application/octet-stream",
        headers={
            "Content-Range": f"bytes {start}-{start + len(part) - 1}/{total}",
            "X-Chunk-Sha256": digest or sha256(part),
        },
    )


@pytest.fixture
def started(api, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    settings.CELERY_TASK_ALWAYS_EAGER = False
    session = str(uuid.uuid4())
    body = {"session_id": session, "size": len(DATA), "sha256": sha256(DATA), "instruction": "free-form test"}
    response = api.post("/api/insitu/uploads/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json(), body


def test_chunks_resume_duplicates_gaps_and_completion(api, started, django_capture_on_commit_callbacks):
    state, body = started
    pk = state["id"]
    assert state["offset"] == 0 and state["status"] == "receiving" and state["chunk_size"] > 0
    assert put(api, pk, 0, DATA[:100_000]).json()["offset"] == 100_000
    # the answer was lost and the client sends the same chunk again: accepted, nothing changes
    assert put(api, pk, 0, DATA[:100_000]).json()["offset"] == 100_000
    # a gap: refused with where to continue
    gap = put(api, pk, 150_000, DATA[150_000:160_000])
    assert gap.status_code == 409 and gap.json()["offset"] == 100_000
    # a corrupted chunk: 400, nothing stored
    bad = put(api, pk, 100_000, DATA[100_000:120_000], digest="0" * 64)
    assert bad.status_code == 400 and "does not match" in bad.json()["detail"]
    # the client restarts and asks where to resume: same session and checksum → 200 with the offset
    again = api.post("/api/insitu/uploads/", body, format="json")
    assert again.status_code == 200 and again.json()["offset"] == 100_000
    assert api.get(f"/api/insitu/uploads/{pk}/").json()["offset"] == 100_000
    with django_capture_on_commit_callbacks() as callbacks:
        done = put(api, pk, 100_000, DATA[100_000:])
    assert done.status_code == 200 and done.json()["status"] == "queued"
    assert len(callbacks) == 1  # processing is queued once the row is committed
    capture = Capture.objects.get(pk=pk)
    assert (capture.received, capture.status) == (len(DATA), "queued")
    from annotation_app.insitu.uploads import archive_file

    assert archive_file(capture).read_bytes() == DATA
    # a late duplicate after completion changes nothing
    assert put(api, pk, 0, DATA[:1000]).json()["status"] == "queued"


def test_whole_file_checksum_mismatch_resets_to_zero(api, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    session = str(uuid.uuid4())
    body = {"session_id": session, "size": len(DATA), "sha256": sha256(DATA[::-1]), "instruction": "x"}
    pk = api.post("/api/insitu/uploads/", body, format="json").json()["id"]
    response = put(api, pk, 0, DATA)
    assert response.status_code == 400 and "does not match its SHA-256" in response.json()["detail"]
    capture = Capture.objects.get(pk=pk)
    assert (capture.received, capture.status) == (0, "receiving")  # recoverable: send it again


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"size": 10, "sha256": "a" * 64}, 400, "needs the instruction"),
        ({"size": 10, "sha256": "xyz", "instruction": "x"}, 400, "invalid fields"),
        ({"size": 0, "sha256": "a" * 64, "instruction": "x"}, 400, "invalid fields"),
        ({"size": 10, "sha256": "a" * 64, "task_id": 999_999}, 400, "not one of yours"),
        ({"size": 10**13, "sha256": "a" * 64, "instruction": "x"}, 413, "the limit is"),
    ],
)
def test_bad_starts_are_refused_clearly(api, body, status, message, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    response = api.post("/api/insitu/uploads/", {"session_id": str(uuid.uuid4()), **body}, format="json")
    assert response.status_code == status and message in str(response.json()), response.json()
    assert not Capture.objects.exists()


def test_same_session_with_other_contents_is_a_conflict(api, started):
    _, body = started
    response = api.post("/api/insitu/uploads/", {**body, "sha256": "b" * 64}, format="json")
    assert response.status_code == 409 and "different contents" in response.json()["detail"]


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Content-Range": "bytes=0-9"}, "Content-Range must be"),
        ({"Content-Range": "bytes 0-99/256000"}, "the body has 10"),
        ({"Content-Range": "bytes 0-9/99"}, "differs from the upload's size"),
    ],
)
def test_bad_chunk_headers(api, started, headers, message):
    state, _ = started
    part = DATA[:10]
    response = api.put(
        f"/api/insitu/uploads/{state['id']}/",
        data=part,
        content_type="application/octet-stream",
        headers={"X-Chunk-Sha256": sha256(part), **headers},
    )
    assert response.status_code == 400 and message in response.json()["detail"]


def test_a_task_upload_needs_the_task_held_and_takes_its_instruction(make_user, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    me = make_user("annotator")
    held = AssignmentFactory(annotator=me)
    client = api_client_for(me)
    body = {"session_id": str(uuid.uuid4()), "size": 10, "sha256": "c" * 64, "task_id": held.task_id}
    assert client.post("/api/insitu/uploads/", body, format="json").status_code == 201
    assert Capture.objects.get().instruction == held.task.instruction
    other = AssignmentFactory()
    body = {"session_id": str(uuid.uuid4()), "size": 10, "sha256": "c" * 64, "task_id": other.task_id}
    assert client.post("/api/insitu/uploads/", body, format="json").status_code == 400


def test_only_the_owner_reaches_a_capture(started, make_user):
    state, _ = started
    stranger = api_client_for(make_user("annotator"))
    for method, url in [
        ("get", f"/api/insitu/uploads/{state['id']}/"),
        ("get", reverse("insitu-capture", args=[state["id"]])),
        ("delete", reverse("insitu-capture", args=[state["id"]])),
        ("post", reverse("insitu-submit", args=[state["id"]])),
    ]:
        assert getattr(stranger, method)(url).status_code == 404
    assert Capture.objects.filter(pk=state["id"]).exists()


def test_owner_deletes_a_capture_with_its_files(api, started, settings):
    state, _ = started
    put(api, state["id"], 0, DATA[:1000])
    folder = settings.MEDIA_ROOT / f"captures/{state['id']}"
    assert folder.exists()
    assert api.delete(reverse("insitu-capture", args=[state["id"]])).status_code == 204
    assert not folder.exists() and not Capture.objects.exists()


@pytest.fixture
def slow_hash(monkeypatch):
    """The whole-file SHA-256 of the last chunk waits for `go` (after setting `hashing`): the upload stays
    `verifying` while the test looks at it."""
    from annotation_app.insitu import uploads

    hashing, go = threading.Event(), threading.Event()
    real = uploads._file_sha256

    def held(path):
        hashing.set()
        assert go.wait(20), "the test never let the hash finish"
        return real(path)

    monkeypatch.setattr(uploads, "_file_sha256", held)
    return hashing, go


def last_chunk_in_a_thread(user, pk: int):
    """PUT the rest of DATA from another thread (its own connection); returns (thread, responses)."""
    responses = []

    def send():
        try:
            responses.append(put(api_client_for(user), pk, 100_000, DATA[100_000:]))
        finally:
            connection.close()

    thread = threading.Thread(target=send)
    thread.start()
    return thread, responses


def test_the_whole_file_check_holds_no_lock(transactional_db, annotator, settings, tmp_path, slow_hash, monkeypatch):
    """While the last chunk's request hashes the archive, the upload is `verifying`: its state answers at once, the
    row is not locked, a duplicate chunk is answered; then the verdict queues processing, once."""
    from annotation_app.insitu import uploads

    settings.MEDIA_ROOT = tmp_path
    queued = []
    monkeypatch.setattr(uploads, "_enqueue", queued.append)
    hashing, go = slow_hash
    api = api_client_for(annotator)
    body = {"session_id": str(uuid.uuid4()), "size": len(DATA), "sha256": sha256(DATA), "instruction": "x"}
    pk = api.post("/api/insitu/uploads/", body, format="json").json()["id"]
    assert put(api, pk, 0, DATA[:100_000]).status_code == 200
    thread, responses = last_chunk_in_a_thread(annotator, pk)
    try:
        assert hashing.wait(20)
        began = time.monotonic()
        state = api.get(f"/api/insitu/uploads/{pk}/").json()
        assert (state["status"], state["offset"], state["stage"]) == ("verifying", len(DATA), "verifying")
        with transaction.atomic():  # the row lock is free: this would raise at once if the hash still held it
            Capture.objects.select_for_update(nowait=True).get(pk=pk)
        duplicate = put(api, pk, 0, DATA[:100_000])  # a retry: answered, not held up, nothing changes
        assert duplicate.status_code == 200 and duplicate.json()["status"] == "verifying"
        assert api.post("/api/insitu/uploads/", body, format="json").json()["status"] == "verifying"
        assert time.monotonic() - began < 5 and not queued
    finally:
        go.set()
        thread.join(30)
    assert responses[0].status_code == 200 and responses[0].json()["status"] == "queued"
    assert queued == [pk] and Capture.objects.get(pk=pk).status == "queued"


def test_a_mismatch_found_outside_the_lock_still_resets_to_zero(transactional_db, annotator, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    api = api_client_for(annotator)
    body = {"session_id": str(uuid.uuid4()), "size": len(DATA), "sha256": sha256(DATA[::-1]), "instruction": "x"}
    pk = api.post("/api/insitu/uploads/", body, format="json").json()["id"]
    response = put(api, pk, 0, DATA)
    assert response.status_code == 400 and "Upload it again from the start" in response.json()["detail"]
    state = api.get(f"/api/insitu/uploads/{pk}/").json()
    assert (state["offset"], state["status"]) == (0, "receiving")
    from annotation_app.insitu.uploads import archive_file

    assert archive_file(Capture.objects.get(pk=pk)).read_bytes() == b""


def test_a_capture_deleted_during_the_check_stays_deleted(transactional_db, annotator, settings, tmp_path, slow_hash):
    """The verdict is applied only to the upload it was computed for: deleted meanwhile, the request answers 404
    and nothing is written back (not even the empty archive of a reset)."""
    settings.MEDIA_ROOT = tmp_path
    hashing, go = slow_hash
    api = api_client_for(annotator)
    body = {"session_id": str(uuid.uuid4()), "size": len(DATA), "sha256": sha256(DATA[::-1]), "instruction": "x"}
    pk = api.post("/api/insitu/uploads/", body, format="json").json()["id"]
    assert put(api, pk, 0, DATA[:100_000]).status_code == 200
    thread, responses = last_chunk_in_a_thread(annotator, pk)
    try:
        assert hashing.wait(20)
        assert api.delete(reverse("insitu-capture", args=[pk])).status_code == 204
    finally:
        go.set()
        thread.join(30)
    assert responses[0].status_code == 404
    assert not Capture.objects.exists() and not (tmp_path / f"captures/{pk}").exists()


def test_a_check_that_died_is_taken_up_again(api, started, django_capture_on_commit_callbacks):
    """A request killed while hashing leaves the upload `verifying`; once that is stale, the upload goes back to
    receiving with its last byte to send, and sending it runs the check again."""
    state, _ = started
    pk = state["id"]
    with django_capture_on_commit_callbacks():
        assert put(api, pk, 0, DATA).json()["status"] == "queued"
    Capture.objects.filter(pk=pk).update(status="verifying", stage="verifying", updated_at=timezone.now())
    assert api.get(f"/api/insitu/uploads/{pk}/").json()["status"] == "verifying"  # a live check: left alone
    Capture.objects.filter(pk=pk).update(updated_at=timezone.now() - timedelta(hours=1))
    state = api.get(f"/api/insitu/uploads/{pk}/").json()
    assert (state["status"], state["offset"]) == ("receiving", len(DATA) - 1)
    with django_capture_on_commit_callbacks() as callbacks:
        done = put(api, pk, len(DATA) - 1, DATA[-1:])
    assert done.status_code == 200 and done.json()["status"] == "queued" and len(callbacks) == 1


def test_the_captures_list_polls_while_something_is_pending_and_then_stops(api, annotator, started):
    state, _ = started
    api.force_login(annotator)
    page = api.get(reverse("insitu")).content.decode()
    assert 'id="captures"' in page and 'hx-trigger="every 2s"' in page  # receiving: the list refreshes itself
    Capture.objects.filter(pk=state["id"]).update(status=Capture.Status.READY)
    partial = api.get(reverse("insitu"), headers={"HX-Request": "true"}).content.decode()
    # the block replaces itself (outerHTML), and without a trigger once nothing is pending: the polling stops
    assert 'id="captures"' in partial
    assert "hx-trigger" not in partial
