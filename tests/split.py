"""Which test files start desktops or sandbox services (`python -m tests.split sandbox|other` lists them): scripts/test
runs those one after another in one pytest process and the others beside it in a second one."""

from __future__ import annotations

import re
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SANDBOX_DIRS = {"sandbox", "live", "simulated"}  # every file there starts a sandbox or uses one
# What starts one: the helpers and fixtures that do, and a test taking the recorder's desktop fixtures as arguments.
# A false match only runs a file in the sandboxed process, where it is safe.
STARTS_SANDBOXES = re.compile(
    r"sandbox_service\(|live_services|live_settings|live_worker|Desktop\.start|\"sandbox\.service\"|create_session_user"
    r"|[(,]\s*(shared_)?desktop\s*[,)]"
)


def starts_sandboxes(path: Path) -> bool:
    """Whether the test file starts desktops, session users or sandbox services (or uses fixtures that do)."""
    relative = path.relative_to(TESTS)
    return relative.parts[0] in SANDBOX_DIRS or bool(STARTS_SANDBOXES.search(path.read_text(encoding="utf-8")))


def test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def main(argv: list[str]) -> int:
    if argv not in (["sandbox"], ["other"]):
        print("usage: python -m tests.split sandbox|other", file=sys.stderr)
        return 2
    wanted = argv[0] == "sandbox"
    for path in test_files():
        if starts_sandboxes(path) == wanted:
            print(path.relative_to(TESTS.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
