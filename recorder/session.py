"""The local session directory of one capture (docs/in-situ.md, format 1): session.json, events.jsonl, audio, frames/;
listing, preview, deletion, and packing into the deterministic tar that is uploaded.

Files whose name starts with a dot (`.recording`, `.capture.json`, `.upload.json`, `.upload.tar`) are the recorder's
own bookkeeping: they live in the session directory but are never packed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .errors import SessionError
from .version import RECORDER

FORMAT = 1
META = "session.json"
EVENTS = "events.jsonl"
FRAMES = "frames"
AUDIO_SUFFIXES = (".wav", ".webm", ".ogg", ".flac")
RECORDING_MARKER = ".recording"  # holds the recording process's pid while a capture runs
SYNC_EVERY_S = 2.0  # fsync the event log at most this often (each line is flushed as it is written)


class EventLog:
    """events.jsonl, append-only: each event is one complete line, flushed when written, so a crash loses at most
    the line being written (readers skip a trailing partial line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8", buffering=1)
        self._synced = time.monotonic()
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            if time.monotonic() - self._synced > SYNC_EVERY_S:
                self._sync()

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._sync()
                self._file.close()


@dataclass(frozen=True)
class Packed:
    """The tar of a session: where it is, its size and SHA-256 (what the upload announces)."""

    path: Path
    size: int
    sha256: str


@dataclass
class Summary:
    session_id: str
    path: Path
    task_id: int | None
    instruction: str | None
    started_wall: float | None
    duration: float  # seconds on the events' clock: how long it ran (or its last event's t, if it crashed)
    events: Counter[str] = field(default_factory=Counter)
    frames: list[str] = field(default_factory=list)  # frame files, in the order the events reference them
    audio_file: str | None = None
    audio_offset: float | None = None
    audio_seconds: float | None = None
    size_bytes: int = 0
    recording: bool = False  # a live recorder process is still writing it
    interrupted: bool = False  # its recorder died without stopping (the events end where it crashed)
    upload: dict[str, Any] | None = None  # .upload.json: the upload's id, server, status


class Session:
    """One capture directory. `Session.create()` makes a new one; `Session(path)` opens an existing one."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r})"

    @classmethod
    def create(
        cls,
        path: Path | str,
        *,
        session_id: str | None = None,
        task_id: int | None = None,
        instruction: str | None = None,
        platform: str | None = None,
    ) -> Session:
        """A new, empty session directory at `path` (which must not exist or be empty) with its session.json."""
        path = Path(path)
        if path.exists() and any(path.iterdir()):
            raise SessionError(f"{path} already holds files; a capture needs a new, empty directory")
        (path / FRAMES).mkdir(parents=True, exist_ok=True)
        session = cls(path)
        session.write_meta(
            {
                "format": FORMAT,
                "session_id": session_id or str(uuid.uuid4()),
                "task_id": task_id,
                "instruction": instruction or "",  # always text: the server's session.json check wants a string
                "screen": None,
                "platform": platform or default_platform(),
                "started_wall": None,
                "audio": None,
                "recorder": RECORDER,
            }
        )
        return session

    # --- files ----------------------------------------------------------------------------------------------------

    @property
    def meta_path(self) -> Path:
        return self.path / META

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS

    @property
    def frames_dir(self) -> Path:
        return self.path / FRAMES

    @property
    def id(self) -> str:
        return str(self.meta()["session_id"])

    def meta(self) -> dict[str, Any]:
        try:
            meta = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise SessionError(f"{self.path} is not a capture (no {META})") from exc
        except (OSError, ValueError) as exc:
            raise SessionError(f"cannot read {self.meta_path}: {exc}") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SessionError(f"{self.meta_path} is not a format-{FORMAT} capture")
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace session.json atomically (a crash leaves the old or the new file, never half of one)."""
        tmp = self.meta_path.with_name(f".{META}.tmp")
        tmp.write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.meta_path)

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        meta = self.meta()
        meta.update(fields)
        self.write_meta(meta)
        return meta

    def events(self) -> Iterator[dict[str, Any]]:
        """The recorded events in order; a partial last line (the recorder crashed while writing it) is skipped."""
        if not self.events_path.exists():
            return
        with self.events_path.open("rb") as lines:
            for line in lines:
                if not line.endswith(b"\n"):
                    break
                if line.strip():
                    yield json.loads(line)

    def read_local(self, name: str) -> dict[str, Any] | None:
        """The recorder's own bookkeeping file `.<name>.json`, if present."""
        path = self.path / f".{name}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_local(self, name: str, data: dict[str, Any]) -> None:
        path = self.path / f".{name}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    # --- recording marker -----------------------------------------------------------------------------------------

    def mark_recording(self) -> None:
        (self.path / RECORDING_MARKER).write_text(str(os.getpid()))

    def unmark_recording(self) -> None:
        (self.path / RECORDING_MARKER).unlink(missing_ok=True)

    def recording_state(self) -> tuple[bool, bool]:
        """(recording, interrupted): a live process holds the marker, or its process is gone without stopping."""
        try:
            pid = int((self.path / RECORDING_MARKER).read_text().strip())
        except (OSError, ValueError):
            return False, False
        return (True, False) if _process_alive(pid) else (False, True)

    # --- preview ----------------------------------------------------------------------------------------------------

    def summary(self) -> Summary:
        meta = self.meta()
        audio = meta.get("audio") if isinstance(meta.get("audio"), dict) else None
        recording, interrupted = self.recording_state()
        summary = Summary(
            session_id=str(meta["session_id"]),
            path=self.path,
            task_id=meta.get("task_id"),
            instruction=meta.get("instruction"),
            started_wall=meta.get("started_wall"),
            duration=0.0,
            recording=recording,
            interrupted=interrupted,
            upload=self.read_local("upload"),
        )
        seen: set[str] = set()
        for event in self.events():
            summary.events[str(event.get("type"))] += 1
            summary.duration = max(summary.duration, float(event.get("t", 0.0)))
            if event.get("type") == "screenshot" and event.get("file") not in seen:
                seen.add(str(event["file"]))
                summary.frames.append(str(event["file"]))
        local = self.read_local("capture") or {}
        summary.duration = max(summary.duration, float(local.get("duration") or 0.0))
        if audio:
            summary.audio_file = audio.get("file")
            summary.audio_offset = audio.get("offset")
            summary.audio_seconds = audio_duration(self.path / str(audio.get("file")))
        summary.size_bytes = sum(path.stat().st_size for path in self._packed_files())
        return summary

    def contact_sheet(self, out: Path, *, columns: int = 4, thumb_width: int = 320, limit: int = 24) -> Path:
        """A PNG of up to `limit` frames spread over the session, each labelled with its time and reason."""
        from PIL import Image, ImageDraw

        shots = [e for e in self.events() if e.get("type") == "screenshot"]
        if not shots:
            raise SessionError(f"session {self.id} has no frames")
        step = max(1, len(shots) / limit)
        chosen = [shots[int(i * step)] for i in range(min(limit, len(shots)))]
        if chosen[-1] is not shots[-1]:
            chosen[-1] = shots[-1]
        thumbs = []
        for shot in chosen:
            with Image.open(self.path / shot["file"]) as image:
                image = image.convert("RGB")
                height = max(1, round(image.height * thumb_width / image.width))
                thumbs.append((shot, image.resize((thumb_width, height))))
        cell_h = max(t.height for _, t in thumbs) + 18
        rows = (len(thumbs) + columns - 1) // columns
        sheet = Image.new("RGB", (columns * (thumb_width + 4), rows * cell_h), "white")
        draw = ImageDraw.Draw(sheet)
        for i, (shot, thumb) in enumerate(thumbs):
            x, y = (i % columns) * (thumb_width + 4), (i // columns) * cell_h
            sheet.paste(thumb, (x, y + 16))
            draw.text((x + 2, y + 2), f"{shot['t']:.1f}s {shot.get('reason', '')}", fill="black")
        out.parent.mkdir(parents=True, exist_ok=True)
        sheet.save(out, "PNG")
        return out

    # --- packing --------------------------------------------------------------------------------------------------

    def _packed_files(self) -> list[Path]:
        """The files that make up the capture, sorted: everything except the recorder's dot-files."""
        files = []
        for path in self.path.rglob("*"):
            relative = path.relative_to(self.path)
            if path.is_file() and not any(part.startswith(".") for part in relative.parts):
                files.append(path)
        return sorted(files, key=lambda p: p.relative_to(self.path).as_posix())

    def pack(self, out: Path | None = None) -> Packed:
        """The uncompressed tar of the capture's files at the archive root, byte-for-byte the same every time for the
        same contents (fixed order, mtimes and owners), so a later run can resume the upload of the same SHA-256.

        A trailing partial line of events.jsonl (a crash while writing it) is left out of the archive.
        """
        out = out or self.path / ".upload.tar"
        meta = self.meta()
        mtime = int(meta.get("started_wall") or 0)
        tmp = out.with_name(out.name + ".tmp")
        with tmp.open("wb") as raw:
            sink = _HashingWriter(raw)
            with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for path in self._packed_files():
                    name = path.relative_to(self.path).as_posix()
                    size = path.stat().st_size
                    if name == EVENTS:
                        size = _complete_lines_length(path)
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = size, mtime, 0o644
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with path.open("rb") as data:
                        tar.addfile(info, _Limited(data, size))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
        return Packed(out, sink.size, sink.sha256.hexdigest())

    def delete(self) -> None:
        recording, _ = self.recording_state()
        if recording:
            raise SessionError(f"session {self.id} is still being recorded; stop the recorder first")
        shutil.rmtree(self.path)


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through to `out`."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data: Any) -> int:
        data = bytes(data)
        self.out.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)


class _Limited(io.RawIOBase):
    """The first `size` bytes of a file (tarfile reads exactly the member's size from it)."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self.file, self.left = file, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.file.read(n)
        self.left -= len(data)
        return data


def _complete_lines_length(path: Path) -> int:
    """Bytes of `path` up to and including its last newline."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb") as data:
        position = size
        while position > 0:
            start = max(0, position - 65536)
            data.seek(start)
            block = data.read(position - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                return start + newline + 1
            position = start
    return 0


def audio_duration(path: Path) -> float | None:
    """Seconds of an audio file soundfile can read (WAV, FLAC, Ogg), None otherwise (e.g. WebM)."""
    try:
        import soundfile

        return float(soundfile.info(str(path)).duration)
    except Exception:
        return None


def default_platform() -> str:
    """The `platform` of session.json: linux | darwin | win32."""
    return "linux" if sys.platform.startswith("linux") else sys.platform


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


# --- the data directory's sessions ------------------------------------------------------------------------------------


def sessions_dir(data: Path) -> Path:
    return data / "sessions"


def list_sessions(data: Path) -> list[Session]:
    """Every capture under the data directory, oldest first."""
    root = sessions_dir(data)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if (path / META).is_file():
            try:
                started = float(Session(path).meta().get("started_wall") or 0)
            except Exception:
                started = 0.0
            found.append((started, path.name, Session(path)))
    return [session for _, _, session in sorted(found, key=lambda item: (item[0], item[1]))]


def find_session(data: Path, ref: str) -> Session:
    """A session by its id, a unique prefix of it, or the path of its directory."""
    path = Path(ref).expanduser()
    if (path / META).is_file():
        return Session(path)
    matches = [s for s in list_sessions(data) if s.path.name.startswith(ref)]
    if not matches:
        raise SessionError(f"no session {ref!r} under {sessions_dir(data)} (see `thinkaloud-recorder list`)")
    if len(matches) > 1:
        names = ", ".join(s.path.name for s in matches[:5])
        raise SessionError(f"{ref!r} matches several sessions ({names}); give more of the id")
    return matches[0]
