"""The uploader against the fault-injecting fake of the upload endpoint (fault_server.py, a real HTTP server on a
socket), for the faults the real endpoint cannot produce on demand (test_upload_django.py uses the real one): chunks,
resume from the server's offset, dropped connections, duplicates, gaps, damaged chunks, a failed whole-file checksum.
In every case the server ends up with exactly the session's tar."""

from __future__ import annotations

import hashlib
import random

import httpx
import pytest

from recorder.errors import AuthError, UploadError
from recorder.upload import Uploader

from .fault_server import FaultInjectingServer
from .test_session import build_session

TOKEN = "secret-token"
CHUNK = 64 * 1024


@pytest.fixture
def server():
    with FaultInjectingServer(token=TOKEN, chunk_size=CHUNK) as server:
        yield server


@pytest.fixture
def session(tmp_path):
    """A session whose tar spans several chunks (incompressible frames)."""
    session = build_session(tmp_path / "s", frames=2)
    noise = random.Random(1).randbytes(5 * CHUNK + 1234)
    (session.frames_dir / "000003.jpg").write_bytes(noise)  # size matters here, not pixels
    return session


def uploader(server: FaultInjectingServer, **options) -> Uploader:
    options.setdefault("backoff", 0.001)
    return Uploader(server.url, TOKEN, **options)


def received(server: FaultInjectingServer, session) -> bytes:
    upload = server.upload_for(session.id)
    assert upload is not None
    return bytes(upload.data)


def tar_of(session) -> bytes:
    packed = session.pack(session.path.parent / "expected.tar")
    return packed.path.read_bytes()


def test_a_clean_upload_in_chunks_with_progress(server, session):
    progress: list[tuple[int, int]] = []
    result = uploader(server, progress=lambda sent, total: progress.append((sent, total))).upload(session)
    expected = tar_of(session)
    assert received(server, session) == expected
    assert (result.status, result.capture, result.size, result.resumed_from) == ("complete", 101, len(expected), 0)
    assert result.sha256 == hashlib.sha256(expected).hexdigest()
    starts = [entry.start for entry in server.puts()]
    assert starts == list(range(0, len(expected), CHUNK))  # one PUT per chunk, in order, nothing twice
    assert progress[0] == (0, len(expected)) and progress[-1] == (len(expected), len(expected))
    assert [sent for sent, _ in progress] == sorted(sent for sent, _ in progress)
    assert session.read_local("upload") == {
        "id": 1, "server": server.url, "sha256": result.sha256, "size": len(expected), "chunk_size": CHUNK,
        "status": "complete", "capture": 101, "complete": True,
    }  # fmt: skip
    assert not (session.path / ".upload.tar").exists()
    server.log.clear()
    again = uploader(server).upload(session)  # nothing left to send
    assert again.status == "complete" and not server.puts()


@pytest.mark.parametrize("seed", [3, 11])
def test_a_connection_dropped_at_a_random_byte_resumes_from_the_servers_offset(server, session, seed):
    size = len(tar_of(session))
    drop_at = random.Random(seed).randrange(1, size - 1)
    server.faults.drop_at_byte = drop_at
    result = uploader(server).upload(session)
    assert result.status == "complete" and received(server, session) == tar_of(session)
    puts = server.puts()
    dropped = next(i for i, entry in enumerate(puts) if entry.status is None)
    assert puts[dropped].start <= drop_at <= puts[dropped].end
    # After the drop the client asked where the server was, and went on from exactly there.
    after = server.log[server.log.index(puts[dropped]) + 1]
    assert (after.method, after.status) == ("GET", 200)
    assert puts[dropped + 1].start == after.offset_before == puts[dropped].offset_before


def test_a_later_run_resumes_an_interrupted_upload(server, session):
    expected = tar_of(session)

    def stop_after_two_chunks(sent: int, total: int) -> None:
        if sent >= 2 * CHUNK:
            raise KeyboardInterrupt  # the annotator closed the laptop

    with pytest.raises(KeyboardInterrupt):
        uploader(server, progress=stop_after_two_chunks).upload(session)
    assert len(received(server, session)) == 2 * CHUNK
    server.log.clear()

    result = uploader(server).upload(session)
    assert result.resumed_from == 2 * CHUNK
    assert server.log[0].method == "GET" and server.log[0].path == "/api/insitu/uploads/1/"  # the remembered id
    assert server.puts()[0].start == 2 * CHUNK  # not from 0
    assert received(server, session) == expected


def test_a_fresh_client_resumes_through_post_too(server, session):
    """Without the remembered id (another computer, a wiped dot-file), POSTing the same session answers the offset."""
    server.faults.drop_at_byte = 3 * CHUNK + 10
    with pytest.raises(UploadError, match=r"stopped after 1 failed attempt\(s\)"):
        uploader(server, retries=0).upload(session)
    (session.path / ".upload.json").unlink()
    server.log.clear()
    result = uploader(server).upload(session)
    assert (server.log[0].method, server.log[0].status) == ("POST", 200)
    assert result.resumed_from == 3 * CHUNK == server.puts()[0].start
    assert received(server, session) == tar_of(session)


def test_duplicates_gaps_and_damaged_chunks(server, session):
    # The second chunk is stored but its answer is lost, and the GET that follows fails: the client re-sends it
    # (a duplicate, answered 200 with the current offset). Later the server loses a chunk it acknowledged (a gap:
    # 409 with its offset), one chunk arrives damaged (400, nothing written) and two PUTs meet a 503.
    server.faults.lose_response_after_write = 1
    server.faults.fail_gets = 1
    server.faults.lose_tail_after = 3 * CHUNK
    server.faults.corrupt_chunks = 0
    result = uploader(server).upload(session)
    assert result.status == "complete" and received(server, session) == tar_of(session)
    puts = server.puts()
    duplicate = [p for p in puts if p.status == 200 and p.start < p.offset_before]
    assert len(duplicate) == 1 and duplicate[0].start == 0
    gap = [p for p in puts if p.status == 409]
    assert len(gap) == 1 and puts[puts.index(gap[0]) + 1].start == gap[0].offset_before

    server.uploads.clear()
    server.log.clear()
    (session.path / ".upload.json").unlink()
    server.faults.corrupt_chunks = 2
    server.faults.fail_puts = 2
    result = uploader(server).upload(session)
    assert result.status == "complete" and received(server, session) == tar_of(session)
    statuses = [p.status for p in server.puts()]
    assert statuses.count(400) == 2 and statuses.count(503) == 2


def test_resent_bytes_that_differ_from_the_stored_ones(server, session):
    """The server stored a damaged first chunk and its answer was lost, then a GET failed: the client re-sends the
    chunk, which differs from what is stored (409 without an offset); it asks, goes on, and the whole-file check at
    the end sends everything again."""
    server.faults.corrupt_stored_at = 10
    server.faults.lose_response_after_write = 1
    server.faults.fail_gets = 1
    result = uploader(server).upload(session)
    assert result.status == "complete" and received(server, session) == tar_of(session)
    statuses = [(p.start, p.status) for p in server.puts()]
    assert statuses[:3] == [(0, None), (0, 409), (CHUNK, 200)]
    assert (0, 400) not in statuses and statuses.count((0, 200)) == 1  # sent again from 0 after the failed file check


def test_a_whole_file_checksum_failure_sends_everything_again(server, session):
    server.faults.corrupt_stored_at = 100  # a stored byte rots: the last chunk's whole-file check fails
    result = uploader(server).upload(session)
    assert result.status == "complete" and received(server, session) == tar_of(session)
    puts = server.puts()
    failed = next(i for i, p in enumerate(puts) if p.status == 400)
    assert puts[failed].end == len(tar_of(session)) - 1 and puts[failed + 1].start == 0


def test_an_upload_still_verifying_is_asked_again_until_it_is_decided(server, session):
    """The answer to the last chunk is lost; the server has every byte and is still checking the whole file
    ("verifying"): that is not the end, the uploader asks again until the verdict."""
    server.faults.lose_response_after_write = 1
    server.faults.verifying_gets = 2
    result = uploader(server, chunk_size=10**7).upload(session)  # one chunk: the first PUT is the last
    assert result.status == "complete" and result.capture == 101 and received(server, session) == tar_of(session)
    assert server.faults.verifying_gets == 0 and len(server.puts()) == 1


def test_the_fake_follows_the_protocol_rules(server):
    """The fake itself, call by call, as test_upload_django.py checks the Django endpoint: the faults above are
    faults of a server that otherwise answers like the real one."""
    data = random.Random(5).randbytes(1000)
    auth = {"Authorization": f"Token {TOKEN}"}

    def put(client: httpx.Client, upload_id: int, start: int, end: int, body: bytes | None = None) -> httpx.Response:
        chunk = data[start : end + 1] if body is None else body
        headers = {
            **auth,
            "Content-Range": f"bytes {start}-{end}/1000",
            "X-Chunk-Sha256": hashlib.sha256(chunk).hexdigest(),
        }
        return client.put(f"/api/insitu/uploads/{upload_id}/", content=chunk, headers=headers)

    with httpx.Client(base_url=server.url) as client:
        body = {"session_id": "s-1", "size": 1000, "sha256": hashlib.sha256(data).hexdigest()}
        assert client.post("/api/insitu/uploads/", json=body).status_code == 401
        created = client.post("/api/insitu/uploads/", json=body, headers=auth)
        assert created.status_code == 201
        assert created.json() == {
            "id": 1,
            "offset": 0,
            "size": 1000,
            "chunk_size": CHUNK,
            "status": "receiving",
            "capture": None,
        }
        assert put(client, 1, 0, 399).json() == {"offset": 400, "status": "receiving"}
        assert client.post("/api/insitu/uploads/", json=body, headers=auth).json()["offset"] == 400  # 200: resume
        other = {**body, "sha256": "0" * 64}
        assert client.post("/api/insitu/uploads/", json=other, headers=auth).status_code == 409
        assert (r := put(client, 1, 100, 199)).status_code == 200 and r.json()["offset"] == 400  # a duplicate
        assert (r := put(client, 1, 500, 599)).status_code == 409 and r.json()["offset"] == 400  # a gap
        assert put(client, 1, 100, 199, body=b"y" * 100).status_code == 409  # re-sent bytes that differ
        bad_sum = client.put(
            "/api/insitu/uploads/1/",
            content=data[400:500],
            headers={**auth, "Content-Range": "bytes 400-499/1000", "X-Chunk-Sha256": "0" * 64},
        )
        assert bad_sum.status_code == 400
        assert client.get("/api/insitu/uploads/1/", headers=auth).json()["offset"] == 400  # nothing written
        assert put(client, 1, 400, 999).json() == {"offset": 1000, "status": "complete"}
        assert client.get("/api/insitu/uploads/1/", headers=auth).json() == {
            "id": 1, "offset": 1000, "size": 1000, "status": "complete", "capture": 101,
        }  # fmt: skip


def test_errors_the_uploader_cannot_fix(server, session, tmp_path):
    with pytest.raises(AuthError, match="rejected the token"):
        Uploader(server.url, "wrong", backoff=0.001).upload(session)

    uploader(server).upload(session)
    changed = build_session(tmp_path / "changed", frames=1)
    changed.update_meta(session_id=session.id)  # the same session id, other contents
    with pytest.raises(UploadError, match="different contents"):
        uploader(server).upload(changed)

    with pytest.raises(UploadError, match=r"cannot reach the server at http://127\.0\.0\.1:9"):
        Uploader("http://127.0.0.1:9", TOKEN, backoff=0.001).upload(session)
