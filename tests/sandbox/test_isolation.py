"""Sessions as users of their own in bubblewrap: shell with timeouts, confined files, and what they can't reach."""

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from sandbox.isolation import PROJECT_ROOT, Limits, create_session_user, delete_session_user, isolation_available
from sandbox.sdk import Files, PathOutsideSession, run_shell

from ..waiting import wait_for

pytestmark = pytest.mark.skipif(not isolation_available(), reason="needs root, bwrap, setpriv, prlimit, useradd")


@pytest.fixture
def sessions_root(tmp_path):
    return tmp_path / "sessions"


@pytest.fixture
def make_session(sessions_root):
    users = []

    def make():
        user = create_session_user(uuid.uuid4().hex[:12], sessions_root)
        users.append(user)
        return user

    yield make
    for user in users:
        delete_session_user(user)


def test_shell_runs_as_the_session_user_with_output_and_exit_code(make_session):
    user = make_session()
    result = run_shell(user, "id -un; pwd; echo oops >&2; exit 3")
    assert result.stdout.split() == [user.name, str(user.home)]
    assert (result.stderr.strip(), result.exit_code, result.timed_out) == ("oops", 3, False)


def test_a_command_past_its_timeout_is_killed_with_its_children(make_session):
    user = make_session()
    started = time.monotonic()
    result = run_shell(user, "sleep 30 & sleep 30; echo never", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None and "never" not in result.stdout
    assert time.monotonic() - started < 5
    assert run_shell(user, "pgrep -u $(id -u) sleep || echo none").stdout.strip() == "none"


def test_sessions_cannot_reach_each_other_or_the_service(make_session):
    alice, bob = make_session(), make_session()
    Files(bob).write("secret.txt", b"bob's")
    for path in [bob.home / "secret.txt", PROJECT_ROOT / "annotation_app" / "settings.py", Path("/root")]:
        result = run_shell(alice, f"cat {path} || ls {path}")
        assert "bob's" not in result.stdout and "SECRET_KEY" not in result.stdout
        assert result.exit_code != 0 or result.stdout.strip() == "", (path, result)
    # Bob's processes are invisible to Alice, so she can't signal them, not even by their host PID.
    bob_sleeps = subprocess.Popen(bob.confine(["sleep", "30"]), start_new_session=True)
    try:
        assert wait_for(lambda: _pids_of(bob.uid, "sleep"))
        (host_pid,) = _pids_of(bob.uid, "sleep")
        result = run_shell(alice, f"ps -eo user= | sort -u; kill -9 {host_pid}; echo rc=$?")
        assert bob.name not in result.stdout and "rc=0" not in result.stdout
        assert _pids_of(bob.uid, "sleep") == [host_pid] and bob_sleeps.poll() is None
    finally:
        os.killpg(bob_sleeps.pid, signal.SIGKILL)
        bob_sleeps.wait()


def test_limits_apply(make_session):
    user = make_session()
    result = run_shell(user, "ulimit -u; ulimit -v", limits=Limits(max_processes=64, max_memory_bytes=512 * 1024**2))
    assert result.stdout.split() == ["64", str(512 * 1024)]


def test_files_stay_inside_the_session(make_session):
    user = make_session()
    files = Files(user)
    files.write("notes/today.txt", "héllo".encode())
    assert files.read("notes/today.txt") == "héllo".encode()
    assert files.list("notes") == [{"name": "today.txt", "type": "file", "size": 6}]
    assert run_shell(user, "cat notes/today.txt && echo more >> notes/today.txt").exit_code == 0
    (user.home / "escape").symlink_to("/etc")
    for path in ["../x", "/etc/passwd", "escape/passwd", "notes/../../x"]:
        with pytest.raises(PathOutsideSession):
            files.read(path)
    with pytest.raises(PathOutsideSession):
        files.write("../../evil", b"x")


def _pids_of(uid: int, name: str) -> list[int]:
    result = subprocess.run(["pgrep", "-u", str(uid), "-x", name], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


def test_sessions_get_none_of_the_services_secrets(make_session):
    user = make_session()
    result = run_shell(user, f"env; cat {PROJECT_ROOT}/var/redis-password {PROJECT_ROOT}/var/database-password")
    secrets = [os.environ[name] for name in ("REDIS_PASSWORD", "DATABASE_PASSWORD") if os.environ.get(name)]
    assert secrets and not any(secret in result.stdout for secret in secrets)
    names = sorted(line.split("=")[0] for line in result.stdout.splitlines() if "=" in line and line[0].isupper())
    assert names == ["HOME", "LANG", "PATH", "PWD", "SHLVL", "USER"]


def test_a_session_memory_cgroup_caps_all_its_processes(sessions_root):
    user = create_session_user(uuid.uuid4().hex[:12], sessions_root, memory_limit_bytes=64 * 1024**2)
    try:
        if user.cgroup is None:
            pytest.skip("this host offers no memory cgroup we may create")
        assert user.name in run_shell(user, "cat /proc/self/cgroup").stdout
        hog = run_shell(user, "tail /dev/zero", timeout_s=30, limits=Limits(max_memory_bytes=None))
        assert hog.exit_code == 137 and not hog.timed_out  # killed by the cgroup, far below the 4 GiB RLIMIT_AS
    finally:
        delete_session_user(user)
    assert not user.cgroup.exists()
