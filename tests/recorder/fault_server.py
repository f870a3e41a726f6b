"""A FAKE of the upload endpoint, kept for FAULT INJECTION: a small, real HTTP server (stdlib http.server in a thread)
that implements the upload protocol (docs/in-situ.md, "Upload protocol") and, on demand, fails the way networks and
servers do: a connection cut at a given byte mid-body, a chunk stored but its answer lost, 5xx answers, a chunk damaged
in transit, a stored byte that rots (the whole-file checksum fails), a server that forgets its last chunk (a gap), and
an upload held in "verifying". The real Django endpoint cannot be made to do any of these at a chosen moment, so the
uploader's recovery from them is tested here (test_upload.py); its behaviour on the real endpoint, served by gunicorn,
is tested in test_upload_django.py, which checks the same protocol rules call by call. It also answers the few API
calls the CLI makes (/api/me/, /api/queue/next/, /api/tasks/<id>/) for the CLI tests that need no database.

Protocol, as implemented here (each rule is the doc's):
- every call needs `Authorization: Token <key>` (else 401);
- POST /api/insitu/uploads/ {"session_id", "size", "sha256", "task_id"?, "instruction"?} -> 201 {"id", "offset": 0,
  "size", "chunk_size", "status": "receiving"}; the same session_id and sha256 again -> 200 with the upload as it
  stands; the same session_id with another sha256 -> 409;
- PUT /api/insitu/uploads/<id>/ with `Content-Range: bytes START-END/SIZE` (inclusive END) and `X-Chunk-Sha256`:
  a checksum mismatch -> 400, nothing written; START == offset -> written, 200 {"offset", "status"}; bytes already
  received (END < offset) that match what is stored -> 200 with the current offset; a gap (START > offset) -> 409
  {"offset"}; when the last byte arrives the whole file's SHA-256 decides: complete (200), or 400 and back to offset 0;
- GET /api/insitu/uploads/<id>/ -> {"id", "offset", "size", "status", "capture"}; "verifying" (offset = size) while
  the whole file's checksum is still being checked for another request.
Reading choices where the doc is silent: a chunk that overlaps the offset (START < offset <= END) is answered 409
{"offset"} (the client re-slices from there); re-sent bytes that differ from what is stored are 409 {"detail"} without
an offset (as the Django endpoint answers them).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
UPLOAD_PATH = re.compile(r"^/api/insitu/uploads/(\d+)/$")
TASK_PATH = re.compile(r"^/api/tasks/(\d+)/$")


@dataclass
class Upload:
    id: int
    session_id: str
    size: int
    sha256: str
    task_id: int | None
    instruction: str | None
    data: bytearray = field(default_factory=bytearray)
    status: str = "receiving"
    capture: int | None = None

    @property
    def offset(self) -> int:
        return len(self.data)

    def state(self) -> dict[str, Any]:
        return {"id": self.id, "offset": self.offset, "size": self.size, "status": self.status, "capture": self.capture}


@dataclass
class Faults:
    """One-shot (or counted) faults the next requests meet."""

    drop_at_byte: int | None = None  # absolute byte of the upload where a PUT's connection is cut mid-body
    lose_response_after_write: int = 0  # PUTs whose chunk is stored but whose connection closes before the answer
    fail_gets: int = 0  # GETs answered 503
    fail_puts: int = 0  # PUTs answered 503 (nothing written)
    corrupt_chunks: int = 0  # PUT bodies damaged in transit (one byte flipped before the checksum check)
    corrupt_stored_at: int | None = None  # flip this stored byte once it is written (whole-file checksum fails)
    lose_tail_after: int | None = None  # once the offset passes this, forget the last chunk once (a gap for the client)
    verifying_gets: int = 0  # GETs of an upload with every byte that answer "verifying" (the whole-file check runs)


@dataclass
class Logged:
    method: str
    path: str
    status: int | None  # None: the connection was dropped without an answer
    start: int | None = None  # a PUT's Content-Range START
    end: int | None = None
    offset_before: int | None = None  # the server's offset when the request arrived


class FaultInjectingServer:
    """Start with `with FaultInjectingServer(token=...) as server:`; `server.url` is its base URL."""

    def __init__(self, token: str = "secret-token", chunk_size: int = 64 * 1024) -> None:
        self.token = token
        self.chunk_size = chunk_size
        self.uploads: dict[int, Upload] = {}
        self.faults = Faults()
        self.log: list[Logged] = []
        self.me = {"username": "ann", "role": "annotator", "capabilities": ["annotate", "view_tasks"]}
        self.tasks: dict[int, dict[str, Any]] = {12: {"id": 12, "instruction": "Rename the file report.txt"}}
        self.queue: list[int] = [12]
        self.lock = threading.Lock()
        self._next_id = 1
        server = self

        class Handler(_Handler):
            fake = server

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="fault-server", daemon=True)

    def __enter__(self) -> FaultInjectingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)

    def upload_for(self, session_id: str) -> Upload | None:
        return next((u for u in self.uploads.values() if u.session_id == session_id), None)

    def puts(self) -> list[Logged]:
        return [entry for entry in self.log if entry.method == "PUT"]


class _Handler(BaseHTTPRequestHandler):
    fake: FaultInjectingServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body leave at once (no 40 ms delayed-ACK stall per request)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # --- helpers ----------------------------------------------------------------------------------------------------

    def _answer(self, status: int, body: dict[str, Any], entry: Logged) -> None:
        entry.status = status
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self, entry: Logged) -> None:
        """Cut the connection without an answer (RST: unread bytes are discarded)."""
        entry.status = None
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _authorized(self, entry: Logged) -> bool:
        if self.headers.get("Authorization") == f"Token {self.fake.token}":
            return True
        self._body()
        self._answer(401, {"detail": "Invalid token."}, entry)
        return False

    def _entry(self) -> Logged:
        entry = Logged(self.command, self.path, None)
        self.fake.log.append(entry)
        return entry

    # --- routes -----------------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        entry = self._entry()
        if not self._authorized(entry):
            return
        ref = self.fake
        if self.path == "/api/me/":
            return self._answer(200, ref.me, entry)
        if match := TASK_PATH.match(self.path):
            task = ref.tasks.get(int(match.group(1)))
            return self._answer(200, task, entry) if task else self._answer(404, {"detail": "Not found."}, entry)
        if match := UPLOAD_PATH.match(self.path):
            with ref.lock:
                if ref.faults.fail_gets > 0:
                    ref.faults.fail_gets -= 1
                    return self._answer(503, {"detail": "try again"}, entry)
                upload = ref.uploads.get(int(match.group(1)))
                if upload is None:
                    return self._answer(404, {"detail": "Not found."}, entry)
                entry.offset_before = upload.offset
                state = upload.state()
                if ref.faults.verifying_gets > 0 and upload.offset == upload.size:
                    ref.faults.verifying_gets -= 1
                    state["status"] = "verifying"
                return self._answer(200, state, entry)
        self._answer(404, {"detail": "Not found."}, entry)

    def do_POST(self) -> None:
        entry = self._entry()
        if not self._authorized(entry):
            return
        ref = self.fake
        raw = self._body()
        if self.path == "/api/queue/next/":
            if not ref.queue:
                return self._answer(404, {"detail": "No pending tasks are left in the queue."}, entry)
            task = ref.tasks[ref.queue[0]]
            return self._answer(200, {"id": 1, "task": task, "status": "active", "assigned_at": "2026-01-01"}, entry)
        if self.path != "/api/insitu/uploads/":
            return self._answer(404, {"detail": "Not found."}, entry)
        try:
            body = json.loads(raw)
            session_id, size, sha256 = str(body["session_id"]), int(body["size"]), str(body["sha256"])
            if size <= 0 or not re.fullmatch(r"[0-9a-f]{64}", sha256):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return self._answer(400, {"detail": "session_id, size and sha256 are required."}, entry)
        with ref.lock:
            existing = ref.upload_for(session_id)
            if existing is not None:
                if existing.sha256 != sha256 or existing.size != size:
                    return self._answer(409, {"detail": "This session was uploaded with other contents."}, entry)
                return self._answer(200, {**existing.state(), "chunk_size": ref.chunk_size}, entry)
            upload = Upload(ref._next_id, session_id, size, sha256, body.get("task_id"), body.get("instruction"))
            ref._next_id += 1
            ref.uploads[upload.id] = upload
            return self._answer(201, {**upload.state(), "chunk_size": ref.chunk_size}, entry)

    def do_PUT(self) -> None:
        entry = self._entry()
        if not self._authorized(entry):
            return
        ref = self.fake
        match = UPLOAD_PATH.match(self.path)
        upload = ref.uploads.get(int(match.group(1))) if match else None
        length = int(self.headers.get("Content-Length") or 0)
        if upload is None:
            self._body()
            return self._answer(404, {"detail": "Not found."}, entry)
        range_match = CONTENT_RANGE.match(self.headers.get("Content-Range", ""))
        if range_match:
            entry.start, entry.end = int(range_match.group(1)), int(range_match.group(2))
        entry.offset_before = upload.offset

        drop_at = ref.faults.drop_at_byte
        if drop_at is not None and entry.start is not None and entry.start <= drop_at < entry.start + length:
            ref.faults.drop_at_byte = None
            self.rfile.read(drop_at - entry.start)  # part of the body arrives, then the line goes dead
            return self._drop(entry)
        chunk = self.rfile.read(length) if length else b""

        with ref.lock:
            if ref.faults.fail_puts > 0:
                ref.faults.fail_puts -= 1
                return self._answer(503, {"detail": "try again"}, entry)
            if range_match is None:
                return self._answer(400, {"detail": "Content-Range: bytes START-END/SIZE is required."}, entry)
            start, end, total = (int(g) for g in range_match.groups())
            if total != upload.size or end < start or end >= total or len(chunk) != end - start + 1:
                return self._answer(400, {"detail": "Content-Range does not match the upload or the body."}, entry)
            if ref.faults.corrupt_chunks > 0:
                ref.faults.corrupt_chunks -= 1
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if hashlib.sha256(chunk).hexdigest() != self.headers.get("X-Chunk-Sha256", "").lower():
                return self._answer(400, {"detail": "The chunk's checksum does not match; nothing was written."}, entry)
            offset = upload.offset
            if start > offset:
                return self._answer(409, {"offset": offset, "detail": f"Expected bytes from {offset}."}, entry)
            if start < offset:
                if end < offset and bytes(upload.data[start : end + 1]) == chunk:
                    return self._answer(200, {"offset": offset, "status": upload.status}, entry)  # a duplicate
                if end < offset:
                    return self._answer(409, {"detail": "These bytes differ from the ones stored."}, entry)
                return self._answer(409, {"offset": offset, "detail": f"Expected bytes from {offset}."}, entry)
            if upload.status != "receiving":
                return self._answer(409, {"offset": offset, "detail": "The upload is complete."}, entry)
            upload.data += chunk
            stored_at = ref.faults.corrupt_stored_at
            if stored_at is not None and stored_at < upload.offset:
                ref.faults.corrupt_stored_at = None
                upload.data[stored_at] ^= 0xFF
            lose_after = ref.faults.lose_tail_after
            lose_tail = lose_after is not None and upload.offset > lose_after and upload.offset < upload.size
            if lose_tail:  # the server "loses" what it just stored, but answers as if it had kept it
                ref.faults.lose_tail_after = None
                answered = upload.offset
                del upload.data[start:]
                return self._answer(200, {"offset": answered, "status": upload.status}, entry)
            if upload.offset == upload.size:
                if hashlib.sha256(upload.data).hexdigest() != upload.sha256:
                    upload.data.clear()
                    upload.status = "receiving"
                    return self._answer(400, {"detail": "The file's checksum does not match; send it again."}, entry)
                upload.status = "complete"
                upload.capture = 100 + upload.id
            if ref.faults.lose_response_after_write > 0:
                ref.faults.lose_response_after_write -= 1
                return self._drop(entry)
            self._answer(200, {"offset": upload.offset, "status": upload.status}, entry)
