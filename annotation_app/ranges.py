"""HTTP Range answers for media files: browsers seek audio only in a resource served with byte ranges (Chromium
treats an answer without them as a stream and snaps a seek back to 0), so the think-aloud audio needs them."""

from __future__ import annotations

import re
from pathlib import Path

from django.http import FileResponse, HttpRequest, HttpResponse

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
MAX_CHUNK = 8 << 20  # one answer holds at most this much; the browser asks for the rest (memory stays bounded)


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """The (first, last) bytes one `Range: bytes=…` header asks for, clipped to the file; None when it asks for
    several ranges or is not a byte range (then the whole file is answered); (-1, -1) when it cannot be satisfied."""
    match = _RANGE.match(header.strip())
    if not match or not (match.group(1) or match.group(2)):
        return None
    first, last = match.group(1), match.group(2)
    if not first:  # the last N bytes
        length = int(last)
        return (max(size - length, 0), size - 1) if length and size else (-1, -1)
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or end < start:
        return (-1, -1)
    return start, end


def file_response(request: HttpRequest, path: Path, content_type: str) -> HttpResponse:
    """The file, whole (200) or the byte range the request asks for (206, or 416 when out of the file)."""
    size = path.stat().st_size
    wanted = byte_range(request.headers.get("Range", ""), size) if request.headers.get("Range") else None
    if wanted is None:
        response: HttpResponse = FileResponse(path.open("rb"), content_type=content_type)
    elif wanted == (-1, -1):
        response = HttpResponse(status=416, content_type="text/plain")
        response["Content-Range"] = f"bytes */{size}"
        response.content = b"The requested range is outside the file."
    else:
        start, end = wanted[0], min(wanted[1], wanted[0] + MAX_CHUNK - 1)
        with path.open("rb") as handle:
            handle.seek(start)
            body = handle.read(end - start + 1)
        response = HttpResponse(body, status=206, content_type=content_type)
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    response["Accept-Ranges"] = "bytes"
    return response
