"""Which processes this test run started: the leak check of tests/conftest.py, scoped to the run itself.

Every process the tests start inherits RUN_MARK (a value unique to this pytest process) from os.environ, and the
watch also follows parent links, because the sandbox starts some programs with a cleared environment (bubblewrap's
`--clearenv`, a desktop's own small environment). A sampler thread records those descendants while their parents are
alive, so a process that is later orphaned (re-parented to init) is still known as ours. Processes of anything else
on the machine (a `scripts/run`, another test run) carry neither the mark nor an ancestor of ours, and are ignored.
"""

from __future__ import annotations

import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

RUN_MARK = "ANNOTATION_TEST_RUN"

Key = tuple[int, int]  # (pid, start time in clock ticks): a pid that is reused is another process


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int
    state: str
    command: str

    @property
    def key(self) -> Key:
        return (self.pid, self.start)


def mark_this_run() -> str:
    """Give this process (and so every child it starts) a fresh run mark; returns it."""
    os.environ[RUN_MARK] = uuid.uuid4().hex
    return os.environ[RUN_MARK]


def read_proc(pid: int) -> Proc | None:
    """One process from /proc (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    fields = stat[stat.rindex(")") + 2 :].split()
    name = stat[stat.index("(") : stat.rindex(")") + 1]  # a kernel thread has no command line
    command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip() or name
    return Proc(pid, int(fields[1]), int(fields[19]), fields[0], command)


def process_table() -> dict[int, Proc]:
    """Every process on the machine, by pid."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (proc := read_proc(int(entry.name))) is not None:
            table[proc.pid] = proc
    return table


def has_mark(pid: int, mark: str) -> bool:
    """Whether the process's environment carries `mark` (readable for our own user's processes, or all as root)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{RUN_MARK}={mark}".encode() in environ.split(b"\0")


class ProcessWatch:
    """Processes started by the run whose root process is `root` and whose children carry `mark`."""

    def __init__(self, mark: str, root: int, interval: float = 0.5) -> None:
        self.mark, self.interval = mark, interval
        root_proc = read_proc(root)
        assert root_proc is not None, f"no process {root}"
        self.root = root_proc.key
        self.ours: set[Key] = {self.root}
        self._marked: dict[Key, bool] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scan(self) -> dict[int, Proc]:
        """Record every live process that is marked or descends from one of ours; returns the process table."""
        table = process_table()
        with self._lock:
            for proc in table.values():
                self._is_ours(proc, table, 0)
        return table

    def _is_ours(self, proc: Proc, table: dict[int, Proc], depth: int) -> bool:
        """Ours when marked, or when its parent is ours (followed up to init; depth bounds a pid cycle)."""
        key = proc.key
        if key in self.ours:
            return True
        if key not in self._marked:
            self._marked[key] = has_mark(proc.pid, self.mark)  # the environment never changes: read it once
        parent = table.get(proc.ppid)
        if self._marked[key] or (parent is not None and depth < 64 and self._is_ours(parent, table, depth + 1)):
            self.ours.add(key)
            return True
        return False

    def leftovers(self) -> list[Proc]:
        """Our processes still running, other than the root (zombies are exited, only not yet reaped)."""
        table = self.scan()
        with self._lock:
            return sorted(
                (p for p in table.values() if p.key in self.ours and p.key != self.root and p.state != "Z"),
                key=lambda p: p.pid,
            )

    def start(self) -> ProcessWatch:
        """Sample in the background, so descendants are known before their parents exit."""
        self._thread = threading.Thread(target=self._sample, name="process-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.scan()
