"""Resumable, checksummed capture uploads (docs/in-situ.md): start or resume, append chunks, verify, queue processing.

Bytes go straight to the archive file under MEDIA_ROOT; the row's `received` is the resume offset and only moves
after the bytes are on disk (fsync), so an interrupted request never leaves the offset ahead of the file. The whole
file's checksum is computed outside the row lock, while the upload is `verifying`.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from .. import queues
from ..models import Capture, User
from ..permissions import tasks_visible_to
from ..trajectories import Conflict, Invalid
from ..upload_checks import UploadRejected

CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
SHA256 = re.compile(r"[0-9a-f]{64}")


class GapError(Conflict):
    """A chunk starts past what was received; `offset` says where to continue (HTTP 409)."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def archive_file(capture: Capture) -> Path:
    return Path(settings.MEDIA_ROOT) / capture.archive_path


def start_upload(
    annotator: User,
    *,
    session_id: uuid.UUID,
    size: int,
    sha256: str,
    task_id: int | None = None,
    instruction: str = "",
) -> tuple[Capture, bool]:
    """The capture for this session, created (True) or as far as it got (False) when the same archive comes again."""
    sha256 = sha256.lower()
    if not SHA256.fullmatch(sha256):
        raise Invalid("sha256 must be 64 hexadecimal characters.")
    if size <= 0:
        raise Invalid("size must be a positive number of bytes; an empty archive is not a capture.")
    if size > settings.MAX_CAPTURE_BYTES:
        raise UploadRejected(
            f"The capture is {size / 2**20:,.0f} MiB; the limit is {settings.MAX_CAPTURE_BYTES / 2**20:,.0f} MiB. "
            "Split long sessions into several recordings.",
            status=413,
        )
    existing = Capture.objects.filter(annotator=annotator, session_id=session_id).first()
    if existing is not None:
        if existing.sha256 != sha256 or existing.size != size:
            raise Conflict(
                f"Session {session_id} was already uploaded with different contents (capture {existing.pk}); "
                "a changed recording needs a new session id."
            )
        return reclaim_stale(existing), False
    task = None
    if task_id is not None:
        task = tasks_visible_to(annotator).filter(pk=task_id).first()
        if task is None:
            raise Invalid(f"Task {task_id} is not one of yours: take it from the queue, or record it free-form.")
        instruction = instruction or task.instruction
    elif not instruction.strip():
        raise Invalid("A free-form recording needs the instruction you worked on.")
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=annotator.pk).first()  # one new upload per user at a time
        check_quota(annotator, size)
        capture = Capture.objects.create(
            annotator=annotator,
            session_id=session_id,
            size=size,
            sha256=sha256,
            task=task,
            instruction=instruction.strip(),
        )
    path = archive_file(capture)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return capture, True


def check_quota(annotator: User, adding: int) -> None:
    """Refuse (413) a capture of `adding` bytes that would take the annotator's captures past MAX_USER_CAPTURE_BYTES.

    Every capture counts until it is deleted, whatever its status: uploads in progress have their space reserved."""
    used = Capture.objects.filter(annotator=annotator).aggregate(total=Sum("size"))["total"] or 0
    quota = settings.MAX_USER_CAPTURE_BYTES
    if used + adding > quota:
        raise UploadRejected(
            f"This capture ({adding / 2**20:,.1f} MiB) would take your captures past your quota: they use "
            f"{used / 2**20:,.1f} MiB of {quota / 2**20:,.1f} MiB. Delete captures you no longer need on the "
            "Think-aloud page, or ask a data lead to raise MAX_USER_CAPTURE_BYTES.",
            status=413,
        )


def check_room(annotator: User) -> None:
    """Refuse (413) to start a recording when the annotator's captures already fill MAX_USER_CAPTURE_BYTES: a
    browser capture's size is known only when it stops, so this is checked when it starts (and again at Record)."""
    used = Capture.objects.filter(annotator=annotator).aggregate(total=Sum("size"))["total"] or 0
    quota = settings.MAX_USER_CAPTURE_BYTES
    if used >= quota:
        raise UploadRejected(
            f"Your captures fill your quota ({used / 2**20:,.1f} MiB of {quota / 2**20:,.1f} MiB): there is no room "
            "for a new recording. Delete captures you no longer need on the Think-aloud page, or ask a data lead "
            "to raise MAX_USER_CAPTURE_BYTES.",
            status=413,
        )


def parse_content_range(header: str | None, body_length: int) -> tuple[int, int, int]:
    """(start, end exclusive, total) from `bytes START-END/TOTAL`, checked against the body."""
    match = CONTENT_RANGE.fullmatch((header or "").strip())
    if not match:
        raise Invalid("Content-Range must be `bytes START-END/TOTAL` (END inclusive).")
    start, last, total = (int(g) for g in match.groups())
    if last < start or last - start + 1 != body_length:
        raise Invalid(f"Content-Range says {last - start + 1} bytes but the body has {body_length}.")
    return start, last + 1, total


def write_chunk(
    capture_id: int, annotator: User, *, content_range: str | None, sha256: str | None, body: bytes
) -> Capture:
    """Store one chunk; duplicates of stored bytes are accepted without change, gaps are refused with the offset.

    The last chunk makes the upload `verifying` under the row lock; the whole file's SHA-256 (seconds for GiBs) is
    computed after that lock is released, so other requests for the capture do not wait on it, and the verdict
    (queued, or back to offset 0) is applied under the lock again, only if nothing changed the upload meanwhile."""
    if len(body) > settings.MAX_CAPTURE_CHUNK_BYTES:
        raise UploadRejected(f"Chunks are at most {settings.MAX_CAPTURE_CHUNK_BYTES:,} bytes.", status=413)
    if not body:
        raise Invalid("The chunk is empty.")
    start, end, total = parse_content_range(content_range, len(body))
    if not sha256 or hashlib.sha256(body).hexdigest() != sha256.lower():
        raise Invalid("The chunk's X-Chunk-Sha256 does not match its bytes; nothing was stored. Send it again.")
    with transaction.atomic():
        capture = Capture.objects.select_for_update().filter(pk=capture_id, annotator=annotator).first()
        if capture is None:
            raise LookupError
        if total != capture.size:
            raise Invalid(f"Content-Range total {total} differs from the upload's size {capture.size}.")
        capture = reclaim_stale(capture)
        if capture.status != Capture.Status.RECEIVING:
            if end <= capture.size:
                return capture  # a late duplicate after completion, or during the whole-file check
            raise Conflict(f"The upload is already {capture.get_status_display().lower()}.")
        path = archive_file(capture)
        if start > capture.received:
            raise GapError(
                f"The chunk starts at byte {start} but only {capture.received} were received.", capture.received
            )
        if end <= capture.received:  # all of it stored already: a retry whose answer was lost
            if _stored(path, start, end) != body:
                raise Conflict(
                    f"Bytes {start}-{end - 1} differ from what was stored before; resume at {capture.received}."
                )
            return capture
        with path.open("r+b") as out:
            out.seek(start)
            out.write(body)
            out.truncate()
            out.flush()
            os.fsync(out.fileno())
        capture.received = end
        update = ["received", "updated_at"]
        if end == capture.size:  # every byte is here: the whole-file check runs once the lock is released
            capture.status = Capture.Status.VERIFYING
            capture.stage = "verifying"
            update += ["status", "stage"]
        capture.save(update_fields=update)
    if capture.status == Capture.Status.VERIFYING:
        return _verify(capture, path)
    return capture


def _verify(capture: Capture, path: Path) -> Capture:
    """Check the whole archive's SHA-256 (no lock held), then queue processing or start the upload over.

    `updated_at`, as saved when the upload became `verifying`, is this check's claim: the verdict is applied only to
    that same state. Meanwhile the capture may have been deleted (404), or a check that looked abandoned (see
    `reclaim_stale`) may have sent it back to receiving; then the current state is answered, unchanged."""
    claim = capture.updated_at
    try:
        matches = _file_sha256(path) == capture.sha256
    except FileNotFoundError:  # deleted meanwhile (or the file is gone: then it must be sent again anyway)
        matches = False
    with transaction.atomic():
        current = Capture.objects.select_for_update().filter(pk=capture.pk).first()
        if current is None:
            raise LookupError
        if current.status != Capture.Status.VERIFYING or current.updated_at != claim:
            return current
        if matches:
            current.status, current.stage = Capture.Status.QUEUED, "queued"
            transaction.on_commit(lambda: _enqueue(current.pk))
        else:  # start over: the reset must be saved, so the error is raised after the commit
            current.status, current.stage, current.received = Capture.Status.RECEIVING, "", 0
            path.write_bytes(b"")
        current.save(update_fields=["status", "stage", "received", "updated_at"])
    if not matches:
        raise ChecksumMismatch(
            "The assembled capture does not match its SHA-256; it was discarded. Upload it again from the start."
        )
    return current


def reclaim_stale(capture: Capture) -> Capture:
    """An upload left `verifying` by a check that died (its server process was killed mid-hash) goes back to
    receiving with its last byte to resend: a client that resumes from the offset sends the last chunk again, and
    the check runs again. A check younger than CAPTURE_VERIFY_STALE_S is left alone."""
    if capture.status != Capture.Status.VERIFYING:
        return capture
    if capture.updated_at > timezone.now() - timedelta(seconds=settings.CAPTURE_VERIFY_STALE_S):
        return capture
    Capture.objects.filter(pk=capture.pk, status=Capture.Status.VERIFYING, updated_at=capture.updated_at).update(
        status=Capture.Status.RECEIVING, stage="", received=capture.size - 1, updated_at=timezone.now()
    )
    capture.refresh_from_db()
    return capture


class ChecksumMismatch(Invalid):
    """The whole archive's checksum failed; the upload was reset to offset 0."""


def _stored(path: Path, start: int, end: int) -> bytes:
    with path.open("rb") as f:
        f.seek(start)
        return f.read(end - start)


def _file_sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _enqueue(capture_id: int) -> None:
    queues.enqueue(queues.PROCESS_CAPTURE, capture_id)


def describe(capture: Capture) -> dict[str, Any]:
    """The upload's state as the API reports it."""
    return {
        "id": capture.pk,
        "session_id": str(capture.session_id),
        "offset": capture.received,
        "size": capture.size,
        "status": capture.status,
        "chunk_size": settings.CAPTURE_CHUNK_BYTES,
        "capture": capture.pk,
        "stage": capture.stage,
        "progress": capture.progress,
        "error": capture.error,
    }
