"""Polling helper for tests that wait on other processes (desktops, terminals, sandboxes)."""

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Poll `predicate` every 50 ms until it is true or `timeout` seconds have passed; returns whether it came true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
