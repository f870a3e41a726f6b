"""The leak check (tests/processes.py) catches what a test run leaves behind, and only that: a detached process, one
with a cleared environment that outlived its parent, but never a process of another run beside it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from .conftest import left_behind
from .processes import RUN_MARK, ProcessWatch, process_table


@contextmanager
def started(command: list[str], **options) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **options)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def pids(watch: ProcessWatch) -> set[int]:
    return {p.pid for p in watch.leftovers()}


def test_a_detached_process_of_this_run_is_a_leak():
    watch = ProcessWatch(os.environ[RUN_MARK], os.getpid())
    running = pids(watch)  # servers of session-scoped fixtures may be running at this point of the run
    with started(["sleep", "60"], start_new_session=True) as sleeper:
        assert sleeper.pid in pids(watch)
        assert {p.pid for p in left_behind(watch, grace=0.5)} - running == {sleeper.pid}
    assert sleeper.pid not in pids(watch) and {p.pid for p in left_behind(watch, grace=0.5)} - running == set()


def test_an_orphan_with_a_cleared_environment_is_still_ours(tmp_path):
    """As bubblewrap's --clearenv starts it: no mark, and its parent exits; the sampler saw the parent link."""
    watch = ProcessWatch(os.environ[RUN_MARK], os.getpid(), interval=0.05).start()
    pid_file = tmp_path / "orphan.pid"
    try:
        script = f"sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {pid_file}; sleep 0.5"
        subprocess.run(["/usr/bin/env", "-i", "/bin/sh", "-c", script], check=True, start_new_session=True)
        orphan = int(pid_file.read_text())
        assert RUN_MARK.encode() not in open(f"/proc/{orphan}/environ", "rb").read()
        assert process_table()[orphan].ppid != os.getpid()  # re-parented: not a descendant of pytest any more
        assert orphan in pids(watch)
    finally:
        watch.stop()
        os.kill(int(pid_file.read_text()), 9)


def test_processes_of_another_run_are_not_counted(tmp_path):
    """A process of another run beside this one (its own mark, not below this run's root: started from another
    shell) is none of this run's business, and that run's own check does see it."""
    other_mark, pid_file = uuid.uuid4().hex, tmp_path / "other.pid"
    script = f"sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {pid_file}"
    env = {**os.environ, RUN_MARK: other_mark}
    subprocess.run(["/bin/sh", "-c", script], check=True, start_new_session=True, env=env)
    theirs = int(pid_file.read_text())
    try:
        with started(["sleep", "60"], start_new_session=True, env=env) as other_root:
            this_run = ProcessWatch(os.environ[RUN_MARK], os.getpid())  # it never saw their parent link
            assert theirs not in pids(this_run) and other_root.pid in pids(this_run)
            assert theirs in pids(ProcessWatch(other_mark, other_root.pid))
    finally:
        os.kill(theirs, 9)
