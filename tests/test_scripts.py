"""The project's scripts on a machine as a new user meets it: `scripts/test` without root refuses to run the suite
with the sandbox tests silently skipped, unless told so."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .servers import ROOT


def as_unprivileged_user_without_sudo(*command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`command` as `nobody` (or as ourselves when we are not root), with a PATH that has no sudo in it."""
    bare = Path(tempfile.mkdtemp(prefix="no-sudo-bin-"))
    bare.chmod(0o755)
    for tool in ("bash", "env", "id", "dirname", "printf", "cat", "mkdir"):
        (bare / tool).symlink_to(shutil.which(tool))
    drop = (
        [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        if os.geteuid() == 0
        else []
    )
    environment = {"PATH": str(bare), "HOME": "/tmp", **env}
    try:
        return subprocess.run(
            [*drop, *command], env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        shutil.rmtree(bare)


def test_scripts_test_refuses_to_skip_the_sandbox_tests_silently():
    result = as_unprivileged_user_without_sudo(str(ROOT / "scripts" / "test"), "--collect-only")
    assert result.returncode == 1
    assert "the sandbox tests need root" in result.stderr and "ALLOW_SKIP_SANDBOX=1" in result.stderr
    assert "running the tests" not in result.stderr  # it stopped before bootstrap and pytest


@pytest.mark.skipif(os.geteuid() != 0, reason="as ourselves it would go on and run the whole suite")
def test_scripts_test_goes_on_when_skipping_is_asked_for():
    """With the opt-out it warns and goes on (as `nobody` it stops right after: it cannot read var/)."""
    result = as_unprivileged_user_without_sudo(str(ROOT / "scripts" / "test"), ALLOW_SKIP_SANDBOX="1")
    assert "sandbox tests that need root are SKIPPED" in result.stderr
    assert "the sandbox tests need root:" not in result.stderr
