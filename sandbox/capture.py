"""Think-aloud capture on sandbox desktops: the recorder's `Capture` runs on a session's X display (input events
arriving over VNC, pre-action frames), while the annotator's browser records the microphone. Stopping hands back the
capture as the same tar the recorder uploads, so one pipeline processes both (docs/in-situ.md)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from recorder.capture import Capture

from .manager import Session


class CaptureConflict(RuntimeError):
    """A capture is already running on this session, or none is (HTTP 409)."""


@dataclass
class _Running:
    capture: Capture
    directory: Path


class Captures:
    """At most one capture per sandbox session; a released session's capture is discarded with it."""

    def __init__(self, root: Path | None = None):
        self.root = root or Path(tempfile.gettempdir()) / "sandbox-captures"
        self.running: dict[str, _Running] = {}
        self.lock = threading.Lock()

    def start(self, session: Session, *, instruction: str = "", task_id: int | None = None) -> float:
        """Start recording the session's desktop; returns the capture clock now (for aligning the browser's audio)."""
        if session.desktop is None:
            raise CaptureConflict("think-aloud capture records desktop sessions (a browser session has no X display)")
        with self.lock:
            if session.session_id in self.running:
                raise CaptureConflict(f"session {session.session_id} is already being captured")
            directory = Path(tempfile.mkdtemp(prefix=f"{session.session_id}-", dir=self._root()))
            capture = Capture(
                directory / "session",
                display=f":{session.desktop.display}",
                audio=None,
                platform="sandbox",
                task_id=task_id,
                instruction=instruction or None,
            )
            self.running[session.session_id] = _Running(capture, directory)
        try:
            capture.start()
        except BaseException:
            self.discard(session.session_id)
            raise
        return capture.now()

    def stop(self, session_id: str) -> tuple[bytes, float]:
        """Stop and pack the capture: (the tar's bytes, the capture clock at stop)."""
        with self.lock:
            running = self.running.pop(session_id, None)
        if running is None:
            raise CaptureConflict(f"session {session_id} is not being captured")
        try:
            at = running.capture.now()
            session = running.capture.stop()  # with every input the X server processed before this call
            packed = session.pack(running.directory / "capture.tar")
            return packed.path.read_bytes(), at
        finally:
            shutil.rmtree(running.directory, ignore_errors=True)

    def discard(self, session_id: str) -> None:
        """Stop without keeping anything (the session is released or its desktop died)."""
        with self.lock:
            running = self.running.pop(session_id, None)
        if running is None:
            return
        try:
            running.capture.stop()
        except Exception:  # the desktop may already be gone; the files go either way
            pass
        shutil.rmtree(running.directory, ignore_errors=True)

    def close(self) -> None:
        for session_id in list(self.running):
            self.discard(session_id)

    def _root(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root
