"""Role walks in real Chromium (tests/test_roles_walk_browser.py, tests/live/test_annotator_walk_browser.py): a
signed-in page whose every answer of 400 or more is collected, so that no error goes unshown, and screenshots of each
page kept under the test's tmp dir."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from playwright.sync_api import Page, Response
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from .browsers import log_in


class Answers:
    """The HTTP answers of 400 or more a page got (the favicon aside), to be matched against the expected ones."""

    def __init__(self, page: Page) -> None:
        self.failed: list[tuple[int, str]] = []
        page.on("response", self._seen)

    def _seen(self, response: Response) -> None:
        if response.status >= 400 and not response.url.endswith("/favicon.ico"):
            self.failed.append((response.status, response.url))

    def only(self, *expected: tuple[int, str]) -> None:
        """Every failed answer is one of `expected` (status, URL pattern), and each expected one happened."""
        unexpected = [f for f in self.failed if not any(f[0] == s and re.search(p, f[1]) for s, p in expected)]
        assert not unexpected, f"answers nobody expected: {unexpected}"
        for status, pattern in expected:
            assert any(f[0] == status and re.search(pattern, f[1]) for f in self.failed), (status, pattern)


class Walk:
    """One signed-in page of one role, its answers watched and its screenshots saved under the test's tmp dir."""

    def __init__(self, page: Page, shots: Path, username: str) -> None:
        self.page, self.shots, self.answers = page, shots, Answers(page)
        log_in(page, username)
        page.wait_for_url(re.compile(r"/(lead|annotate|flywheel)/$"))

    def shot(self, name: str) -> None:
        """A screenshot for people to look at: a record, not an assertion, so one that times out on a loaded machine
        (a long full page) is skipped with a warning rather than failing the walk."""
        try:
            self.page.screenshot(path=self.shots / f"{name}.png", full_page=True, timeout=60_000)
        except PlaywrightTimeout as exc:
            warnings.warn(f"screenshot {name} skipped: {exc.message.splitlines()[0]}", stacklevel=2)
