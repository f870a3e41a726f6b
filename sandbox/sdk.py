"""SDK functions beside GUI actions (the report's hybrid environment): shell commands and files of one session.

Shell commands run confined as the session's user (see isolation.py) with a timeout; file paths are resolved
inside the session's home and can't escape it, through `..`, absolute paths or symlinks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .isolation import Limits, SessionUser

MAX_OUTPUT_BYTES = 1024 * 1024
MAX_FILE_BYTES = 50 * 1024 * 1024


class PathOutsideSession(ValueError):
    """The path would leave the session's directory."""


@dataclass(frozen=True)
class ShellResult:
    exit_code: int | None  # None when the command was killed at its timeout
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


def run_shell(user: SessionUser, command: str, *, timeout_s: float = 30.0, limits: Limits | None = None) -> ShellResult:
    """Run `command` with bash in the session's home, as its user; output is captured (first 1 MiB of each)."""
    argv = user.confine(["bash", "-c", command], limits)
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # bwrap's --die-with-parent takes the whole sandbox down with it
        stdout, stderr = proc.communicate()
        timed_out = True
    return ShellResult(
        exit_code=None if timed_out else proc.returncode,
        stdout=stdout[:MAX_OUTPUT_BYTES].decode(errors="replace"),
        stderr=stderr[:MAX_OUTPUT_BYTES].decode(errors="replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


class Files:
    """Read, write and list files of one session's home; everything else is out of reach."""

    def __init__(self, user: SessionUser) -> None:
        self.user = user
        self.root = user.home.resolve()

    def resolve(self, path: str) -> Path:
        candidate = Path(path) if Path(path).is_absolute() else self.root / path
        resolved = Path(os.path.realpath(candidate))
        if not resolved.is_relative_to(self.root):
            raise PathOutsideSession(f"{path!r} is outside the session's directory")
        return resolved

    def read(self, path: str) -> bytes:
        target = self.resolve(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path!r} is not a file in the session")
        if target.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path!r} is larger than {MAX_FILE_BYTES} bytes")
        return target.read_bytes()

    def write(self, path: str, data: bytes) -> None:
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"files are limited to {MAX_FILE_BYTES} bytes")
        target = self.resolve(path)
        created = []
        parent = target.parent
        while not parent.exists():
            created.append(parent)
            parent = parent.parent
        for directory in reversed(created):
            directory.mkdir()
            os.chown(directory, self.user.uid, self.user.gid)
        target.write_bytes(data)
        os.chown(target, self.user.uid, self.user.gid)  # the session's own apps can edit it

    def list(self, path: str = ".") -> list[dict[str, object]]:
        directory = self.resolve(path)
        if not directory.is_dir():
            raise NotADirectoryError(f"{path!r} is not a directory in the session")
        return [
            {"name": entry.name, "type": "dir" if entry.is_dir() else "file", "size": entry.stat().st_size}
            for entry in sorted(directory.iterdir())
        ]
