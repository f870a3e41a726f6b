"""Unpack an uploaded capture archive safely and check its session.json (docs/in-situ.md, format 1).

Only the documented files are extracted, as plain files inside the destination: no links, devices, absolute paths or
`..`; limits on member count and total size keep a hostile archive from filling the disk.
"""

from __future__ import annotations

import json
import re
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
AUDIO_NAME = re.compile(r"audio\.(wav|webm|ogg|oga|flac|mp3)")
FRAME_NAME = re.compile(r"frames/[\w.-]+\.(jpe?g|png)")


class CaptureError(ValueError):
    """The capture can't be processed; the message says what is wrong in words the annotator can act on."""


@dataclass
class CaptureFiles:
    root: Path
    session: dict[str, Any]
    events: Path
    audio: Path | None
    frames: set[str] = field(default_factory=set)  # relative names, as events reference them
    skipped: list[str] = field(default_factory=list)  # members that are not part of the format


def _wanted(name: str) -> bool:
    return name in ("session.json", "events.jsonl") or bool(AUDIO_NAME.fullmatch(name) or FRAME_NAME.fullmatch(name))


def unpack(archive: Path, dest: Path, *, max_members: int = 200_000, max_bytes: int = 8 << 30) -> CaptureFiles:
    """Extract the capture's files from `archive` (an uncompressed or gzip tar) into `dest` and check them."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise CaptureError(f"The upload is not a readable tar archive ({exc}).") from None
    members, skipped, total = [], [], 0
    with tar:
        try:
            for count, member in enumerate(tar, 1):
                if count > max_members:
                    raise CaptureError(f"The archive has more than {max_members:,} files.")
                name = member.name.removeprefix("./")
                if member.isdir() and name in ("", ".", "frames"):
                    continue
                if not (member.isfile() and _wanted(name)):
                    skipped.append(member.name)
                    continue
                total += member.size
                if total > max_bytes:
                    raise CaptureError(f"The archive unpacks to more than {max_bytes / 2**30:.0f} GiB.")
                member.name = name
                members.append(member)
            dest.mkdir(parents=True, exist_ok=True)
            tar.extractall(dest, members=members, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise CaptureError(f"The archive is damaged ({exc}); upload it again.") from None
    names = {m.name for m in members}
    for required in ("session.json", "events.jsonl"):
        if required not in names:
            raise CaptureError(f"The archive has no {required}: is it a capture made by the recorder?")
    session = check_session(_read_json(dest / "session.json"))
    audio = None
    if session.get("audio"):
        audio_name = session["audio"]["file"]
        if audio_name not in names:
            raise CaptureError(f"session.json names the audio file {audio_name}, which is not in the archive.")
        audio = dest / audio_name
    frames = {n for n in names if n.startswith("frames/")}
    return CaptureFiles(dest, session, dest / "events.jsonl", audio, frames, skipped)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaptureError(f"session.json is not valid JSON ({exc}).") from None


def check_session(meta: Any) -> dict[str, Any]:
    """`meta` if it is a valid session.json; CaptureError naming the field otherwise."""
    if not isinstance(meta, dict):
        raise CaptureError("session.json must be a JSON object.")
    if meta.get("format") != FORMAT:
        raise CaptureError(
            f"session.json: format {meta.get('format')!r} is not supported (this server reads {FORMAT})."
        )
    try:
        uuid.UUID(str(meta.get("session_id")))
    except ValueError:
        raise CaptureError("session.json: session_id must be a UUID.") from None
    screen = meta.get("screen")
    if not isinstance(screen, dict) or not all(
        isinstance(screen.get(k), int) and 0 < screen[k] <= 32768 for k in ("width", "height")
    ):
        raise CaptureError("session.json: screen must give width and height in pixels.")
    scale = screen.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0.25 <= scale <= 8:
        raise CaptureError("session.json: screen.scale must be a number between 0.25 and 8.")
    audio = meta.get("audio")
    if audio is not None:
        if not isinstance(audio, dict) or not AUDIO_NAME.fullmatch(str(audio.get("file", ""))):
            raise CaptureError("session.json: audio.file must be audio.wav, .webm, .ogg, .flac or .mp3.")
        offset = audio.get("offset", 0.0)
        if isinstance(offset, bool) or not isinstance(offset, int | float) or abs(offset) > 86400:
            raise CaptureError("session.json: audio.offset must be seconds on the events' clock.")
    instruction = meta.get("instruction", "")
    if not isinstance(instruction, str) or len(instruction) > 10_000:
        raise CaptureError("session.json: instruction must be text (at most 10,000 characters).")
    return meta
