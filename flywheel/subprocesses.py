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


def _processes() -> dict[int, tuple[int, int, str]]:
    """{pid: (ppid, pgrp, start time)} of the live (not zombie) processes, from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": state, ppid, pgrp, …, starttime (20th)
        if len(fields) > 19 and fields[0] != "Z":
            found[int(entry)] = (int(fields[1]), int(fields[2]), fields[19])
    return found


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is `pgid` (the leader may be gone while its children run)."""
    return [pid for pid, (_, group, _) in _processes().items() if group == pgid]


def tree(pid: int) -> list[int]:
    """`pid`, its descendants and its process group's members: torchrun starts its ranks in sessions of their own."""
    table = _processes()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo += [child for child, (parent, _, _) in table.items() if parent == current]
    found += [p for p, (_, group, _) in table.items() if group == pid and p not in found]
    return [p for p in found if p in table]


def stop_pids(pids: list[int], grace: float = GRACE_S) -> None:
    """SIGTERM each process, wait up to `grace` seconds, then SIGKILL what is left (the same processes: a pid reused
    meanwhile, told apart by its start time, is left alone)."""
    table = _processes()
    started = {pid: table[pid][2] for pid in pids if pid in table}

    def alive() -> list[int]:
        now = _processes()
        return [pid for pid, start in started.items() if pid in now and now[pid][2] == start]

    for pid in alive():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:  # zombies don't count: the caller reaps its child
        time.sleep(0.1)
    for pid in alive():
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_group(pgid: int, grace: float = GRACE_S) -> None:
    """Stop the child `pgid` leads: its process group and every descendant (SIGTERM, then SIGKILL after `grace`)."""
    stop_pids(tree(pgid), grace)


def stop_orphan(host: str | None, marker: str) -> bool:
    """Stop what an earlier (killed) run left running on this host: the processes whose command line names `marker`,
    the stage's own run directory (torchrun's ranks outlive their launcher). Returns whether there were any."""
    if host != socket.gethostname():
        return False
    me = os.getpid()
    ours = [pid for pid in _processes() if pid != me and marker in _cmdline(pid)]
    if ours:
        stop_pids(ours)
    return bool(ours)


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
