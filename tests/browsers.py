"""Real Chromium for page tests: the sandbox's Chromium and flags, one context per page, JavaScript errors fail."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection
from playwright.sync_api import Page, sync_playwright

from sandbox.browser import CHROMIUM, CHROMIUM_ARGS


@contextmanager
def chromium_pages(base_url: str, extra_args: tuple[str, ...] = ()) -> Iterator[Callable[[], Page]]:
    """Yields a factory of fresh pages on `base_url`; after the block, no page may have thrown a JavaScript error.

    Playwright's sync API keeps an event loop on this thread: set DJANGO_ALLOW_ASYNC_UNSAFE for ORM calls here."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", *CHROMIUM_ARGS, *extra_args])
        errors: list[str] = []

        def new_page() -> Page:
            page = browser.new_context(base_url=base_url).new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            return page

        yield new_page
        browser.close()
        # Inside Playwright the ORM runs in a context of its own: close that connection too, or the test database
        # can't be dropped at the end.
        connection.close()
        assert not errors, f"JavaScript errors: {errors}"


def log_in(page: Page, username: str, password: str = "pw") -> None:
    page.goto("/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
