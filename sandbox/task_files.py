"""The task-files directory: the only host files an OSWorld task's `upload_file` may copy into a session.

When the sandbox service isolates sessions it runs as root, so a `local_path` anywhere would let a task file copy
`/etc/shadow` or the service's API key into an annotator's desktop. `SANDBOX_TASK_FILES` names the directory
(default `var/task-files` of the project); paths are relative to it, or absolute inside it; `..` and symlinks that
lead out of it are refused. The web app checks at import and the service again at setup, with this one function.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_TASK_FILES = Path(__file__).resolve().parent.parent / "var" / "task-files"


class TaskFileOutside(ValueError):
    """A `local_path` that is not a file name inside the task-files directory; the message says why."""


def task_files_root() -> Path:
    """The task-files directory, from `SANDBOX_TASK_FILES` (read on every call, so tests and services can set it)."""
    return Path(os.environ.get("SANDBOX_TASK_FILES") or DEFAULT_TASK_FILES).resolve()


def task_file(local_path: str, root: Path | None = None) -> Path:
    """The real path of `local_path` inside the task-files directory, or TaskFileOutside saying why not.

    The file need not exist yet (imports come before files are copied in); what exists of the path is resolved, so a
    symlink inside the directory that points out of it is refused."""
    root = (root or task_files_root()).resolve()
    if not isinstance(local_path, str) or not local_path.strip():
        raise TaskFileOutside("must be a non-empty path in the task-files directory")
    if "\0" in local_path:
        raise TaskFileOutside("contains a NUL byte")
    path = Path(local_path)
    if ".." in path.parts:
        raise TaskFileOutside(f"{local_path!r} contains '..'; give a path inside the task-files directory {root}")
    candidate = path if path.is_absolute() else root / path
    real = candidate.resolve()
    if not real.is_relative_to(root) or real == root:
        reason = "leads out of" if candidate.absolute().is_relative_to(root) else "is outside"
        raise TaskFileOutside(f"{local_path!r} {reason} the task-files directory {root} (SANDBOX_TASK_FILES)")
    return real


def read_task_file(local_path: str, root: Path | None = None) -> bytes:
    """The bytes of a task file, opened without following a symlink swapped in after the check."""
    real = task_file(local_path, root)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"no task file {local_path!r} in {real.parent}") from None
    except OSError as exc:  # ELOOP: the last component became a symlink
        raise TaskFileOutside(f"{local_path!r} can't be opened safely ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise TaskFileOutside(f"{local_path!r} is not a regular file")
        return handle.read()
