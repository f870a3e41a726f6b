"""Session directories: the deterministic tar that is uploaded, preview summaries, contact sheets, deletion, lookup."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from recorder.errors import SessionError
from recorder.session import EventLog, Session, find_session, list_sessions, sessions_dir

from .conftest import make_wav


def build_session(path: Path, frames: int = 3, *, audio: Path | None = None, started: float = 1795000000.5) -> Session:
    """A finished capture made by hand: frames, a few events, optional audio."""
    session = Session.create(path, task_id=7, instruction="Open the settings")
    session.update_meta(screen={"width": 64, "height": 48, "scale": 1.0}, started_wall=started)
    log = EventLog(session.events_path)
    log.append({"type": "window", "t": 0.0, "wall": started, "title": "Files"})
    for i in range(1, frames + 1):
        Image.new("RGB", (64, 48), (40 * i, 0, 0)).save(session.frames_dir / f"{i:06d}.jpg", "JPEG")
        t = float(i)
        log.append(
            {"type": "screenshot", "t": t, "wall": started + t, "file": f"frames/{i:06d}.jpg", "reason": "pre_action"}
        )
        log.append({"type": "down", "t": t, "wall": started + t, "x": i, "y": i, "button": "left"})
        log.append({"type": "up", "t": t + 0.1, "wall": started + t + 0.1, "x": i, "y": i, "button": "left"})
    log.close()
    if audio is not None:
        (session.path / "audio.wav").write_bytes(audio.read_bytes())
        session.update_meta(audio={"file": "audio.wav", "offset": 0.25})
    return session


def test_the_tar_is_the_capture_and_the_same_bytes_every_time(tmp_path):
    session = build_session(tmp_path / "s", audio=make_wav(tmp_path / "a.wav", seconds=1.0))
    session.write_local("upload", {"id": 1})  # the recorder's bookkeeping is never packed
    session.mark_recording()
    session.unmark_recording()

    first = session.pack(tmp_path / "one.tar")
    os.utime(session.meta_path, (1, 1))  # file times do not matter
    second = session.pack(tmp_path / "two.tar")
    assert (first.size, first.sha256) == (second.size, second.sha256)
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.sha256 == hashlib.sha256(first.path.read_bytes()).hexdigest()

    with tarfile.open(first.path) as tar:
        names = tar.getnames()
        assert names == sorted(names)
        assert names == [
            "audio.wav", "events.jsonl", "frames/000001.jpg", "frames/000002.jpg", "frames/000003.jpg",
            "session.json",
        ]  # fmt: skip
        for member in tar.getmembers():
            assert member.isfile() and member.uid == 0 and member.mtime == 1795000000
            assert tar.extractfile(member).read() == (session.path / member.name).read_bytes()


def test_a_crash_mid_line_is_readable_and_left_out_of_the_tar(tmp_path):
    session = build_session(tmp_path / "s", frames=1)
    whole = session.events_path.read_bytes()
    with session.events_path.open("ab") as events:
        events.write(b'{"type":"key_do')  # the recorder died while writing this line
    assert len(list(session.events())) == 4
    packed = session.pack()
    with tarfile.open(packed.path) as tar:
        assert tar.extractfile("events.jsonl").read() == whole
    assert session.events_path.read_bytes().endswith(b"key_do")  # the directory itself is not rewritten


def test_summary_preview_and_contact_sheet(tmp_path):
    session = build_session(tmp_path / "s", audio=make_wav(tmp_path / "a.wav", seconds=1.5))
    summary = session.summary()
    assert summary.duration == pytest.approx(3.1)
    assert dict(summary.events) == {"window": 1, "screenshot": 3, "down": 3, "up": 3}
    assert summary.frames == ["frames/000001.jpg", "frames/000002.jpg", "frames/000003.jpg"]
    assert (summary.audio_file, summary.audio_offset, summary.audio_seconds) == ("audio.wav", 0.25, 1.5)
    assert (summary.task_id, summary.instruction) == (7, "Open the settings")
    assert summary.size_bytes == sum(p.stat().st_size for p in session.path.rglob("*") if p.is_file())
    assert not summary.recording and not summary.interrupted

    sheet = session.contact_sheet(tmp_path / "sheet.png", columns=2, thumb_width=32)
    image = Image.open(io.BytesIO(sheet.read_bytes()))
    assert image.format == "PNG" and image.size == (2 * 36, 2 * (24 + 18))


def test_recording_marker_says_recording_or_interrupted(tmp_path):
    session = build_session(tmp_path / "s", frames=1)
    session.mark_recording()  # this process: alive
    assert session.summary().recording
    with pytest.raises(SessionError, match="still being recorded"):
        session.delete()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (session.path / ".recording").write_text(dead.stdout.strip())
    summary = session.summary()
    assert summary.interrupted and not summary.recording
    session.delete()
    assert not session.path.exists()


def test_sessions_are_found_by_id_prefix_or_path(tmp_path):
    root = sessions_dir(tmp_path)
    a = build_session(root / "aaaa1111-0000-0000-0000-000000000000", started=2.0)
    b = build_session(root / "aaaa2222-0000-0000-0000-000000000000", started=1.0)
    assert [s.path for s in list_sessions(tmp_path)] == [b.path, a.path]  # oldest first
    assert find_session(tmp_path, "aaaa1").path == a.path
    assert find_session(tmp_path, str(b.path)).path == b.path
    with pytest.raises(SessionError, match="several sessions"):
        find_session(tmp_path, "aaaa")
    with pytest.raises(SessionError, match="no session"):
        find_session(tmp_path, "zzz")
    with pytest.raises(SessionError, match="already holds files"):
        Session.create(a.path)
