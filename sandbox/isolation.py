"""Each sandbox session runs as an unprivileged user of its own, inside bubblewrap, with resource limits.

A session's commands see the machine read-only except their own home; the service's code, data and secrets, other
sessions' homes and /root are hidden behind empty tmpfs mounts; they live in their own PID namespace (they can't
see or signal anyone else's processes), their own network namespace (only a loopback of their own: no route to the
host's PostgreSQL, Redis, sandbox service or policy server, nor anywhere else) and under per-user process and
memory limits. Of the X sockets they see only their own display's, which wants the cookie in their own home.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class IsolationError(RuntimeError):
    """The session's user or sandbox could not be set up."""


@dataclass(frozen=True)
class Limits:
    max_processes: int = 256
    max_memory_bytes: int | None = (
        4 * 1024**3
    )  # address space (RLIMIT_AS); None for Chromium, whose V8 reserves far more
    max_open_files: int = 1024


# Chromium maps tens of GiB of address space it never uses, so an RLIMIT_AS cap kills it at start.
BROWSER_LIMITS = Limits(max_processes=512, max_memory_bytes=None, max_open_files=4096)


@dataclass(frozen=True)
class SessionUser:
    name: str
    uid: int
    gid: int
    home: Path
    hidden: tuple[Path, ...] = field(default=())  # paths masked from this session's commands
    cgroup: Path | None = None  # memory cgroup every process of the session joins, when the host offers one
    display: int | None = None  # the session's own X display: the only X socket its commands see
    xauthority: Path | None = None  # the cookie of that display (in the home, readable by this user alone)

    def with_display(self, display: int, xauthority: Path) -> SessionUser:
        """This user once its desktop runs: its commands get that display's socket, DISPLAY and XAUTHORITY."""
        return replace(self, display=display, xauthority=xauthority)

    def join_cgroup(self) -> list[str]:
        """A prefix that moves the command into the session's memory cgroup before it runs (empty without one)."""
        if self.cgroup is None:
            return []
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup)]

    def confine(
        self,
        command: list[str],
        limits: Limits | None = None,
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> list[str]:
        """`command` wrapped to run as this user, in bubblewrap, under `limits`. The environment is cleared (the
        service's holds its secrets) down to PATH, HOME, USER, LANG, DISPLAY and XAUTHORITY of its display, and
        `env`."""
        limits = limits or Limits()
        wrapper = [
            "bwrap",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
        ]
        for path in self.hidden:
            if path.exists():
                wrapper += ["--tmpfs", str(path)]
        # Everything around it is hidden above; this session's home comes back, writable, and so does its own X
        # socket (no other display's; the abstract ones stay behind in the host's network namespace).
        wrapper += ["--bind", str(self.home), str(self.home)]
        variables = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "USER": self.name,
            "LANG": "C.UTF-8",
        }
        if self.display is not None:
            socket = x_socket(self.display)
            wrapper += ["--perms", "0755", "--dir", str(socket.parent), "--bind", str(socket), str(socket)]
            variables["DISPLAY"] = f":{self.display}"
            if self.xauthority is not None:
                variables["XAUTHORITY"] = str(self.xauthority)
        # Their own network namespace: a loopback of their own, no route to the host's loopback services or out.
        wrapper += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session"]
        wrapper += ["--chdir", str(cwd or self.home), "--clearenv"]
        for name, value in {**variables, **(env or {})}.items():
            wrapper += ["--setenv", name, value]
        limit = ["prlimit", f"--nproc={limits.max_processes}", f"--nofile={limits.max_open_files}"]
        limit += [f"--as={limits.max_memory_bytes}"] if limits.max_memory_bytes else []
        limit += ["--"]
        return [*self.join_cgroup(), *wrapper, "--", *limit, *self.drop_privileges(), *command]

    def drop_privileges(self) -> list[str]:
        """A prefix that runs the command as this user, with no supplementary groups and no way back up."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--no-new-privs", "--"]


def x_socket(display: int) -> Path:
    """The filesystem socket of X display `display`."""
    return Path(f"/tmp/.X11-unix/X{display}")


def isolation_available() -> bool:
    """Root, and the tools: bubblewrap, setpriv, prlimit, useradd."""
    tools = ("bwrap", "setpriv", "prlimit", "useradd", "userdel")
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in tools)


CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")
SESSION_MEMORY_BYTES = 4 * 1024**3


def memory_cgroup(name: str, limit_bytes: int) -> Path | None:
    """A memory cgroup capped at `limit_bytes` (cgroup v2 or v1's memory controller); None where the host has none
    we may create (then only the per-process limits apply)."""
    if (CGROUP_V2 / "cgroup.controllers").exists() and "memory" in (CGROUP_V2 / "cgroup.controllers").read_text():
        path, limit_file = CGROUP_V2 / name, "memory.max"
    elif (CGROUP_V1_MEMORY / "memory.limit_in_bytes").exists():
        path, limit_file = CGROUP_V1_MEMORY / name, "memory.limit_in_bytes"
    else:
        return None
    try:
        path.mkdir(exist_ok=True)
        (path / limit_file).write_text(str(limit_bytes))
    except OSError:
        return None
    return path


def session_cgroup(name: str) -> Path | None:
    """The memory cgroup of session user `name` if it exists (v2 or v1's memory controller), e.g. after a crash."""
    for base in (CGROUP_V2, CGROUP_V1_MEMORY):
        path = base / name
        if (path / "cgroup.procs").exists() and (base == CGROUP_V1_MEMORY or (base / "cgroup.controllers").exists()):
            return path
    return None


def remove_cgroup(path: Path) -> None:
    """Remove an empty session cgroup (its processes are killed first by delete_session_user)."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)  # the last processes are still exiting


def create_session_user(
    session_id: str,
    sessions_root: Path,
    *,
    hidden: tuple[Path, ...] = (),
    memory_limit_bytes: int = SESSION_MEMORY_BYTES,
) -> SessionUser:
    """A fresh system user `sbx-<id>` with a private home `sessions_root/<id>` (mode 0700) and, where the host
    allows, a memory cgroup of `memory_limit_bytes` for all its processes together."""
    if not isolation_available():
        raise IsolationError("session isolation needs root and bwrap, setpriv, prlimit, useradd (scripts/bootstrap)")
    if not session_id.isalnum():
        raise IsolationError(f"session id {session_id!r} must be alphanumeric")
    name = f"sbx-{session_id[:24]}"
    home = sessions_root / session_id
    sessions_root.mkdir(parents=True, exist_ok=True)
    os.chmod(sessions_root, 0o711)  # others may pass through to their own home, not list the sessions
    result = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
         "--user-group", name],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise IsolationError(f"useradd {name} failed: {result.stderr.strip()}")
    entry = pwd.getpwnam(name)
    home.mkdir(mode=0o700)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    masked = (PROJECT_ROOT, Path("/root"), sessions_root, *hidden)
    cgroup = memory_cgroup(name, memory_limit_bytes)
    return SessionUser(name, entry.pw_uid, entry.pw_gid, home, masked, cgroup)


def delete_session_user(user: SessionUser) -> None:
    """Kill whatever the user still runs, then remove the user, its home, its memory cgroup and the X lock and
    socket files its killed X server left (those it owns). Each part is tried even when another fails."""
    kill_user_processes(user.uid)
    remove_x_files_of(user.uid)
    subprocess.run(["userdel", user.name], capture_output=True)
    shutil.rmtree(user.home, ignore_errors=True)
    if user.cgroup is not None:
        remove_cgroup(user.cgroup)


def kill_user_processes(uid: int, timeout_s: float = 3.0) -> None:
    """SIGKILL every process of `uid` until none is left (userdel refuses a user that still runs something)."""
    deadline = time.monotonic() + timeout_s
    while True:
        subprocess.run(["pkill", "-KILL", "-u", str(uid)], capture_output=True)
        if not running_processes_of(uid) or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def running_processes_of(uid: int) -> list[int]:
    """Pids of the processes of real or effective `uid` that still run (zombies waiting to be reaped left out)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue  # it exited meanwhile
        uids = fields.get("Uid", "").split()
        if str(uid) in uids[:2] and not fields.get("State", "").strip().startswith(("Z", "X")):
            pids.append(int(status.parent.name))
    return pids


def remove_x_files_of(uid: int) -> None:
    """Remove X lock files and display sockets owned by `uid` (an X server killed with SIGKILL leaves both)."""
    for path in [*Path("/tmp").glob(".X*-lock"), *Path("/tmp/.X11-unix").glob("X*")]:
        try:
            if path.lstat().st_uid == uid:
                path.unlink()
        except OSError:
            pass


def session_users_under(sessions_root: Path) -> list[SessionUser]:
    """The session users (`sbx-*`) whose home is directly in `sessions_root`: this root's sessions alone, as each
    copy of the project has a root of its own; with their memory cgroup when one exists."""
    root = Path(os.path.abspath(sessions_root))
    users = []
    for entry in pwd.getpwall():
        home = Path(os.path.abspath(entry.pw_dir))
        if entry.pw_name.startswith("sbx-") and home.parent == root:
            cgroup = session_cgroup(entry.pw_name)
            users.append(SessionUser(entry.pw_name, entry.pw_uid, entry.pw_gid, home, cgroup=cgroup))
    return users
