"""The resumable, checksummed upload of a session's tar (docs/in-situ.md, "Upload protocol"): create or resume with
POST, send chunks with PUT (Content-Range + X-Chunk-Sha256), and whenever something goes wrong ask the server with GET
where it is and carry on from there. The upload's id is kept in the session directory (.upload.json), so a later run
picks up where an interrupted one stopped.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from .api import ApiClient, check, detail
from .errors import ServerError, UploadError
from .session import Packed, Session

UPLOADS = "/api/insitu/uploads/"
DEFAULT_CHUNK_SIZE = 8 * 1024 * 1024
TIMEOUT = httpx.Timeout(120.0, connect=10.0)
Progress = Callable[[int, int], None]  # (bytes the server has, total bytes)


@dataclass(frozen=True)
class UploadResult:
    id: Any
    status: str
    capture: Any
    size: int
    sha256: str
    resumed_from: int  # the server's offset when this run started sending (0 for a fresh upload)


class Uploader:
    """Uploads sessions to one server. `retries` consecutive failures (with exponential backoff from `backoff` up to
    `max_backoff` seconds) end the run with an UploadError; running it again resumes."""

    def __init__(
        self,
        server: str,
        token: str,
        *,
        progress: Progress | None = None,
        retries: int = 8,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        chunk_size: int | None = None,
        timeout: httpx.Timeout | float = TIMEOUT,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.server, self.token = server.rstrip("/"), token
        self.progress = progress or (lambda sent, total: None)
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.chunk_size = chunk_size
        self.timeout = timeout
        self.sleep = sleep

    # --- the protocol's three calls -----------------------------------------------------------------------------------

    def _create(self, api: ApiClient, session: Session, packed: Packed) -> dict[str, Any]:
        meta = session.meta()
        body: dict[str, Any] = {"session_id": meta["session_id"], "size": packed.size, "sha256": packed.sha256}
        if meta.get("task_id") is not None:
            body["task_id"] = meta["task_id"]
        if meta.get("instruction"):
            body["instruction"] = meta["instruction"]
        response = self._retrying(lambda: api.http.post(UPLOADS, json=body))
        if response.status_code == 409:
            raise UploadError(
                f"the server already has session {meta['session_id']} with different contents ({detail(response)}); "
                "it cannot be uploaded again",
                409,
            )
        check(response, (200, 201))
        return response.json()

    def _get(self, api: ApiClient, upload_id: Any) -> dict[str, Any] | None:
        response = self._retrying(lambda: api.http.get(f"{UPLOADS}{upload_id}/"))
        if response.status_code == 404:
            return None
        check(response, (200,))
        return response.json()

    def _where(self, api: ApiClient, upload_id: Any) -> dict[str, Any] | None:
        """One GET for the server's offset after a failure; None when it cannot tell right now (we keep ours)."""
        try:
            response = api.http.get(f"{UPLOADS}{upload_id}/")
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        return response.json()

    # --- retries ----------------------------------------------------------------------------------------------------

    def _retrying(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        failures = 0
        while True:
            try:
                response = send()
            except httpx.ConnectError as exc:  # nothing listens there (yet): a few quick tries, not minutes
                if failures >= min(self.retries, 2):
                    raise UploadError(f"cannot reach the server at {self.server}: {exc or type(exc).__name__}") from exc
                failures = self._failed(failures, f"network: {exc or type(exc).__name__}")
                continue
            except httpx.TransportError as exc:
                failures = self._failed(failures, f"network: {exc or type(exc).__name__}")
                continue
            if response.status_code >= 500 or response.status_code == 429:
                failures = self._failed(failures, f"server: {response.status_code} {detail(response)}")
                continue
            return response

    def _failed(self, failures: int, reason: str) -> int:
        """Count a failure; wait before the next try, or give up after `retries` in a row."""
        failures += 1
        if failures > self.retries:
            raise UploadError(
                f"the upload to {self.server} stopped after {failures} failed attempt(s) in a row ({reason}); "
                "run the upload again later: it resumes where the server is"
            )
        delay = min(self.max_backoff, self.backoff * 2 ** (failures - 1))
        self.sleep(delay * random.uniform(0.5, 1.0))
        return failures

    # --- upload -----------------------------------------------------------------------------------------------------

    def upload(self, session: Session) -> UploadResult:
        recording, _ = session.recording_state()
        if recording:
            raise UploadError(f"session {session.id} is still being recorded; stop the recorder first")
        packed = session.pack()
        with ApiClient(self.server, self.token, timeout=self.timeout) as api:
            result = self._send(api, session, packed)
        packed.path.unlink(missing_ok=True)
        return result

    def _send(self, api: ApiClient, session: Session, packed: Packed) -> UploadResult:
        state = session.read_local("upload") or {}
        upload: dict[str, Any] | None = None
        if state.get("id") is not None and state.get("server") == self.server and state.get("sha256") == packed.sha256:
            upload = self._get(api, state["id"])  # resume the upload a previous run began
        if upload is None:
            upload = self._create(api, session, packed)
        upload_id = upload["id"]
        chunk_size = int(self.chunk_size or upload.get("chunk_size") or state.get("chunk_size") or DEFAULT_CHUNK_SIZE)
        state = {"id": upload_id, "server": self.server, "sha256": packed.sha256, "size": packed.size}
        state.update(chunk_size=chunk_size, status=upload.get("status"), capture=upload.get("capture"))
        session.write_local("upload", state)

        offset, status, capture = int(upload.get("offset", 0)), str(upload.get("status", "receiving")), None
        resumed_from = offset
        size = packed.size
        self.progress(offset, size)
        failures, recreated = 0, False
        with packed.path.open("rb") as data:
            # "verifying": the server has every byte and is checking the whole file (a mismatch sends it back to 0)
            while not (status == "complete" or (offset >= size and status not in ("receiving", "verifying"))):
                if offset >= size:  # the server has every byte but is not done: ask again
                    failures = self._failed(failures, f"the server has all {size} bytes but says {status!r}")
                    if (where := self._where(api, upload_id)) is not None:
                        offset, status = int(where["offset"]), str(where.get("status", status))
                    continue
                data.seek(offset)
                chunk = data.read(min(chunk_size, size - offset))
                headers = {
                    "Content-Range": f"bytes {offset}-{offset + len(chunk) - 1}/{size}",
                    "X-Chunk-Sha256": hashlib.sha256(chunk).hexdigest(),
                    "Content-Type": "application/octet-stream",
                }
                try:
                    response = api.http.put(f"{UPLOADS}{upload_id}/", content=chunk, headers=headers)
                except httpx.TransportError as exc:
                    failures = self._failed(failures, f"network: {exc or type(exc).__name__}")
                    if (where := self._where(api, upload_id)) is not None:
                        offset, status = int(where["offset"]), str(where.get("status", status))
                    continue
                code = response.status_code
                if code == 200:
                    body = response.json()
                    offset, status = int(body["offset"]), str(body.get("status", status))
                    capture = body.get("capture", capture)
                    failures = 0
                elif code == 409 and (server_offset := _offset_of(response)) is not None:
                    # a gap: the server is elsewhere (it lost data, or another run got further): go where it is
                    if server_offset == offset:
                        failures = self._failed(failures, f"409 at offset {offset}: {detail(response)}")
                    offset = server_offset
                elif code in (400, 409):
                    # 400: the chunk arrived damaged, or the whole file's checksum failed (the server went back to
                    # 0); 409 without an offset: re-sent bytes differ from the stored ones. Ask where it is.
                    failures = self._failed(failures, f"{code}: {detail(response)}")
                    if (where := self._where(api, upload_id)) is not None:
                        offset, status = int(where["offset"]), str(where.get("status", status))
                elif code >= 500 or code == 429:
                    failures = self._failed(failures, f"server: {code} {detail(response)}")
                    if (where := self._where(api, upload_id)) is not None:
                        offset, status = int(where["offset"]), str(where.get("status", status))
                elif code == 404 and not recreated:  # the server forgot the upload: start it again
                    recreated = True
                    upload = self._create(api, session, packed)
                    upload_id, offset = upload["id"], int(upload.get("offset", 0))
                    status = str(upload.get("status", "receiving"))
                    state["id"] = upload_id
                    session.write_local("upload", state)
                else:
                    check(response, (200,))
                self.progress(offset, size)

        if capture is None and (final := self._where(api, upload_id)) is not None:
            capture = final.get("capture")
        state.update(status=status, capture=capture, complete=True)
        session.write_local("upload", state)
        return UploadResult(upload_id, status, capture, size, packed.sha256, resumed_from)


def _offset_of(response: httpx.Response) -> int | None:
    try:
        return int(response.json()["offset"])
    except (ValueError, KeyError, TypeError):
        return None


def upload_session(session: Session, server: str, token: str, **options: Any) -> UploadResult:
    """Upload one session (see Uploader for the options)."""
    try:
        return Uploader(server, token, **options).upload(session)
    except ServerError:
        raise
    except httpx.HTTPError as exc:
        raise UploadError(f"the upload failed: {exc}") from exc
