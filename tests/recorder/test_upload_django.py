"""The recorder's uploader against the real Django endpoint, served by gunicorn as in production, on the test
database: chunks, a resumed upload (by its remembered id and by POSTing again), the protocol's rules call by call,
and the errors it cannot fix. The archive the server stores is exactly the session's tar, and the capture is queued.
(test_upload.py covers the faults only a fault-injecting server can produce on demand.)"""

from __future__ import annotations

import hashlib
import random
import uuid

import httpx
import pytest
from rest_framework.authtoken.models import Token

from annotation_app.celery import app
from annotation_app.insitu.uploads import archive_file
from annotation_app.models import Capture
from recorder.errors import AuthError, ServerError, UploadError
from recorder.upload import Uploader

from ..factories import AssignmentFactory
from ..servers import web_stack
from .conftest import cli_env, run_cli
from .test_session import build_session

CHUNK = 64 * 1024

pytestmark = pytest.mark.slow


@pytest.fixture
def django_server(transactional_db, media, tmp_path):
    """gunicorn (and daphne) on the test database and this test's MEDIA_ROOT; yields the base URL."""
    with web_stack(tmp_path) as base:
        yield base
    app.control.purge()  # completed uploads queued their processing; no worker runs here


@pytest.fixture
def assignment():
    return AssignmentFactory()


@pytest.fixture
def token(assignment) -> str:
    return Token.objects.create(user=assignment.annotator).key


@pytest.fixture
def session(tmp_path, assignment):
    """A session of the annotator's assigned task whose tar spans several chunks (incompressible frames)."""
    session = build_session(tmp_path / "s", frames=2)
    session.update_meta(session_id=str(uuid.uuid4()), task_id=assignment.task_id)
    (session.frames_dir / "000003.jpg").write_bytes(random.Random(1).randbytes(5 * CHUNK + 1234))
    return session


def tar_of(session) -> bytes:
    return session.pack(session.path.parent / "expected.tar").path.read_bytes()


def stored(capture: Capture) -> bytes:
    return archive_file(capture).read_bytes()


def test_a_clean_upload_in_chunks_becomes_a_queued_capture(django_server, token, session, assignment):
    progress: list[tuple[int, int]] = []
    uploader = Uploader(django_server, token, chunk_size=CHUNK, backoff=0.001, progress=lambda *p: progress.append(p))
    result = uploader.upload(session)
    expected = tar_of(session)
    capture = Capture.objects.get(session_id=session.id)
    assert (result.status, result.capture, result.size, result.resumed_from) == ("queued", capture.pk, len(expected), 0)
    assert result.sha256 == hashlib.sha256(expected).hexdigest() == capture.sha256
    assert stored(capture) == expected and capture.received == capture.size == len(expected)
    assert (capture.status, capture.task_id, capture.annotator_id) == (
        "queued",
        assignment.task_id,
        assignment.annotator_id,
    )
    assert capture.instruction == assignment.task.instruction or capture.instruction == "Open the settings"
    sent = [s for s, _ in progress]
    assert sent == sorted(sent) and progress[-1] == (len(expected), len(expected))
    assert len(set(sent)) == -(-len(expected) // CHUNK) + 1  # 0, then one step per chunk: nothing sent twice
    assert session.read_local("upload")["complete"] is True
    again = Uploader(django_server, token, backoff=0.001).upload(session)  # nothing left to send
    assert (again.status, again.capture, again.resumed_from) == ("queued", capture.pk, len(expected))


def test_an_interrupted_upload_resumes_where_the_server_is(django_server, token, session):
    expected = tar_of(session)

    def stop_after_two_chunks(sent: int, total: int) -> None:
        if sent >= 2 * CHUNK:
            raise KeyboardInterrupt  # the annotator closed the laptop

    with pytest.raises(KeyboardInterrupt):
        Uploader(django_server, token, chunk_size=CHUNK, backoff=0.001, progress=stop_after_two_chunks).upload(session)
    capture = Capture.objects.get(session_id=session.id)
    assert (capture.status, capture.received) == ("receiving", 2 * CHUNK)

    result = Uploader(django_server, token, chunk_size=CHUNK, backoff=0.001).upload(session)  # by the remembered id
    assert result.resumed_from == 2 * CHUNK and result.capture == capture.pk
    capture.refresh_from_db()
    assert capture.status == "queued" and stored(capture) == expected

    # Another computer (no .upload.json) POSTs the same session: the server answers where it is, nothing is re-sent.
    (session.path / ".upload.json").unlink()
    again = Uploader(django_server, token, chunk_size=CHUNK, backoff=0.001).upload(session)
    assert (again.status, again.capture, again.resumed_from) == ("queued", capture.pk, len(expected))
    assert Capture.objects.filter(session_id=session.id).count() == 1


def test_errors_the_uploader_cannot_fix(django_server, token, session, tmp_path):
    with pytest.raises(AuthError, match="rejected the token"):
        Uploader(django_server, "wrong", backoff=0.001).upload(session)

    Uploader(django_server, token, backoff=0.001).upload(session)
    changed = build_session(tmp_path / "changed", frames=1)
    changed.update_meta(session_id=session.id, task_id=session.meta()["task_id"])  # same id, other contents
    with pytest.raises(UploadError, match="different contents"):
        Uploader(django_server, token, backoff=0.001).upload(changed)

    foreign = build_session(tmp_path / "foreign", frames=1)
    foreign.update_meta(session_id=str(uuid.uuid4()), task_id=AssignmentFactory().task_id)  # someone else's task
    with pytest.raises(ServerError, match=r"400: Task \d+ is not one of yours"):
        Uploader(django_server, token, backoff=0.001).upload(foreign)


def test_the_cli_logs_in_shows_the_task_and_uploads(django_server, token, assignment, session, tmp_path):
    """`thinkaloud-recorder` as an annotator runs it (a real subprocess) against the real server."""
    env = cli_env(tmp_path)
    bad = run_cli(env, "login", "--server", django_server, "--token", "wrong")
    assert bad.returncode == 1 and "rejected the token (401" in bad.stderr
    login = run_cli(env, "login", "--server", django_server + "/api/", "--token", token)
    assert login.returncode == 0 and f"as {assignment.annotator.username} (annotator)" in login.stdout, login.stderr
    tasks = run_cli(env, "tasks")
    assert tasks.returncode == 0 and f"Task {assignment.task_id}" in tasks.stdout, tasks.stderr
    assert assignment.task.instruction in tasks.stdout
    uploaded = run_cli(env, "upload", str(session.path))
    assert uploaded.returncode == 0, uploaded.stderr
    capture = Capture.objects.get(session_id=session.id)
    assert f": queued, capture {capture.pk}" in uploaded.stdout and stored(capture) == tar_of(session)


def test_the_protocol_rules_call_by_call(django_server, token):
    """The rules of docs/in-situ.md, as test_upload.py checks them on the fault-injecting server, on the real one."""
    data = random.Random(5).randbytes(1000)
    auth = {"Authorization": f"Token {token}"}

    def put(client: httpx.Client, upload_id: int, start: int, end: int, body: bytes | None = None) -> httpx.Response:
        chunk = data[start : end + 1] if body is None else body
        headers = {
            **auth,
            "Content-Range": f"bytes {start}-{end}/1000",
            "X-Chunk-Sha256": hashlib.sha256(chunk).hexdigest(),
            "Content-Type": "application/octet-stream",
        }
        return client.put(f"/api/insitu/uploads/{upload_id}/", content=chunk, headers=headers)

    with httpx.Client(base_url=django_server, timeout=30) as client:
        body = {"session_id": str(uuid.uuid4()), "size": 1000, "sha256": hashlib.sha256(data).hexdigest()}
        body["instruction"] = "free-form"
        assert client.post("/api/insitu/uploads/", json=body).status_code == 401
        created = client.post("/api/insitu/uploads/", json=body, headers=auth)
        assert created.status_code == 201, created.text
        upload_id = created.json()["id"]
        assert {k: created.json()[k] for k in ("offset", "size", "status")} == {
            "offset": 0, "size": 1000, "status": "receiving",
        }  # fmt: skip
        assert created.json()["chunk_size"] > 0
        assert put(client, upload_id, 0, 399).json()["offset"] == 400
        resumed = client.post("/api/insitu/uploads/", json=body, headers=auth)
        assert resumed.status_code == 200 and resumed.json()["offset"] == 400
        other = {**body, "sha256": "0" * 64}
        assert client.post("/api/insitu/uploads/", json=other, headers=auth).status_code == 409
        assert (r := put(client, upload_id, 100, 199)).status_code == 200 and r.json()["offset"] == 400  # duplicate
        assert (r := put(client, upload_id, 500, 599)).status_code == 409 and r.json()["offset"] == 400  # a gap
        assert put(client, upload_id, 100, 199, body=b"y" * 100).status_code == 409  # re-sent bytes that differ
        bad_sum = client.put(
            f"/api/insitu/uploads/{upload_id}/",
            content=data[400:500],
            headers={**auth, "Content-Range": "bytes 400-499/1000", "X-Chunk-Sha256": "0" * 64},
        )
        assert bad_sum.status_code == 400
        assert client.get(f"/api/insitu/uploads/{upload_id}/", headers=auth).json()["offset"] == 400  # not written
        last = put(client, upload_id, 400, 999)
        assert last.status_code == 200 and (last.json()["offset"], last.json()["status"]) == (1000, "queued")
        state = client.get(f"/api/insitu/uploads/{upload_id}/", headers=auth).json()
        assert (state["offset"], state["size"], state["status"], state["capture"]) == (1000, 1000, "queued", upload_id)
    assert stored(Capture.objects.get(pk=upload_id)) == data
