"""Checks every uploaded file passes before it is stored: kind (by its bytes, not its name), size and checksum."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from django.core.files.uploadedfile import UploadedFile

# The formats we accept: content type -> byte patterns (offset, bytes) that must all match the file's head.
Signature = tuple[tuple[int, bytes], ...]
IMAGE_FORMATS: dict[str, Signature] = {
    "image/png": ((0, b"\x89PNG\r\n\x1a\n"),),
    "image/jpeg": ((0, b"\xff\xd8\xff"),),
    "image/webp": ((0, b"RIFF"), (8, b"WEBP")),
}
AUDIO_FORMATS: dict[str, Signature] = {
    "audio/wav": ((0, b"RIFF"), (8, b"WAVE")),
    "audio/webm": ((0, b"\x1a\x45\xdf\xa3"),),  # Matroska/WebM, what browsers' MediaRecorder writes
    "audio/ogg": ((0, b"OggS"),),
    "audio/flac": ((0, b"fLaC"),),
    "audio/mpeg": ((0, b"ID3"),),
}


class UploadRejected(ValueError):
    """The upload can't be accepted; `status` is the HTTP status to answer with (400, 413 or 415)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CheckedFile:
    content_type: str
    sha256: str
    size: int


def sniff(head: bytes, formats: dict[str, Signature]) -> str | None:
    """The content type whose byte signature `head` carries, if any."""
    for content_type, patterns in formats.items():
        if all(head[offset : offset + len(magic)] == magic for offset, magic in patterns):
            return content_type
    return None


def _digest(upload: UploadedFile) -> str:
    sha = hashlib.sha256()
    for chunk in upload.chunks():
        sha.update(chunk)
    upload.seek(0)
    return sha.hexdigest()


def check_size(upload: UploadedFile, *, what: str, max_bytes: int) -> None:
    """413 for a file over `max_bytes`."""
    if upload.size is not None and upload.size > max_bytes:
        raise UploadRejected(f"{what} is {upload.size} bytes; the limit is {max_bytes} bytes.", status=413)


def check_upload(
    upload: UploadedFile,
    *,
    what: str,
    max_bytes: int,
    formats: dict[str, Signature] | None,
    expected_sha256: str | None = None,
) -> CheckedFile:
    """Reject files that are too large, of the wrong kind, or whose SHA-256 differs from the one the client sent."""
    if upload.size is None or upload.size == 0:
        raise UploadRejected(f"{what} is empty.")
    check_size(upload, what=what, max_bytes=max_bytes)
    head = upload.read(16)
    upload.seek(0)
    if formats is None:
        content_type = "application/x-ndjson"
    else:
        content_type = sniff(head, formats) or ""
        if not content_type:
            raise UploadRejected(f"{what} is not a supported format; send one of: {', '.join(formats)}.", status=415)
    digest = _digest(upload)
    if expected_sha256 is not None and expected_sha256.lower() != digest:
        raise UploadRejected(
            f"{what} checksum mismatch: the client sent {expected_sha256}, the server computed {digest}."
        )
    return CheckedFile(content_type=content_type, sha256=digest, size=upload.size)


def count_event_lines(upload: UploadedFile) -> int:
    """Validate a JSON Lines event log (each line an object with a numeric 't') and count its events."""
    count = 0
    for lineno, raw in enumerate(upload, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UploadRejected(f"events line {lineno} is not valid JSON: {exc}") from None
        if not isinstance(event, dict) or not isinstance(event.get("t"), int | float):
            raise UploadRejected(f"events line {lineno} must be an object with a numeric timestamp 't'.")
        count += 1
    upload.seek(0)
    return count
