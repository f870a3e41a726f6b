"""Child processes of the flywheel's stages (the trainer's CLI): started in a process group of their own, watched,
and stopped as a group (SIGTERM, then SIGKILL) on cancel or when a rerun finds an orphan of a killed worker.

No Django here: the stage code passes what it needs in, so this module can be tested and reused on its own."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
GRACE_S = 10.0


class Stopped(Exception):
    """The watcher asked the child to stop (a cancel); its process group was killed."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    """Ask Linux to SIGKILL the child when the worker that started it dies (kill -9 included)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not glibc: the rerun's orphan check still stops it
        pass


def start(
    command: Sequence[str], *, log: Path, cwd: Path, env: dict[str, str], stdout: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` in a new session (its own process group), stderr (and stdout, unless `stdout` names a file of
    its own) appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out, stdout.open("wb") if stdout else open(os.devnull, "wb") as own:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        return subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdout=own if stdout else out,
            stderr=subprocess.STDOUT if not stdout else out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is `pgid` (read from /proc: the leader may be gone while its children run)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": state, ppid, pgrp, …
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def stop_group(pgid: int, grace: float = GRACE_S) -> None:
    """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL what is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < deadline:  # zombies don't count: the caller reaps its child
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_orphan(host: str | None, pgid: int | None, marker: str) -> bool:
    """Stop a process group an earlier (killed) run left behind on this host, when its processes still run `marker`
    (the run directory) — a recycled group id never gets a signal. Returns whether there was one."""
    if not pgid or host != socket.gethostname():
        return False
    ours = [pid for pid in group_members(pgid) if marker in _cmdline(pid)]
    if not ours:
        return False
    stop_group(pgid)
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait(proc: subprocess.Popen[bytes], *, tick: Callable[[], bool], every: float = 0.5, grace: float = GRACE_S) -> int:
    """Wait for the child, calling `tick()` every `every` seconds; when it returns True (cancel), stop the group and
    raise Stopped. Returns the exit status."""
    while True:
        try:
            return proc.wait(timeout=every)
        except subprocess.TimeoutExpired:
            pass
        try:
            stop = tick()
        except BaseException:
            stop_group(proc.pid, grace)
            proc.wait()
            raise
        if stop:
            stop_group(proc.pid, grace)
            proc.wait()
            raise Stopped


def tail(path: Path, lines: int = 50, max_bytes: int = 64_000) -> list[str]:
    """The last `lines` lines of a text file (reads at most its last `max_bytes`)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    text = data.decode(errors="replace").replace("\r", "\n")
    return [line for line in text.splitlines() if line.strip()][-lines:]
