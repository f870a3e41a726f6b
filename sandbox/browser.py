"""Browser sandboxes for web tasks and HTML5 games: Chromium over CDP (Playwright, Debian's /usr/bin/chromium).

Actions and screenshots go through the same grammar as desktops; JavaScript verifier snippets read page state
(a score, a level, a DOM value) for rewards. Playwright's sync API belongs to the thread that started it, so each
browser session owns one worker thread and every call runs there: callers may come from any thread.
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from PIL import Image
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from .actions import (
    Action,
    CallUser,
    Click,
    Drag,
    Fail,
    Finished,
    Hotkey,
    Hover,
    LeftDouble,
    Navigate,
    NavigateBack,
    Press,
    Release,
    RightSingle,
    Scroll,
    Type,
    Wait,
)
from .coordinates import ScreenMapping, pixel_of
from .desktop import UnsupportedAction
from .isolation import BROWSER_LIMITS, SessionUser
from .settle import CAP_S, Settled

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]  # fmt: skip
# UI-TARS key names -> Playwright key names.
KEYS = {
    "ctrl": "Control", "control": "Control", "alt": "Alt", "shift": "Shift", "cmd": "Meta", "meta": "Meta",
    "super": "Meta", "win": "Meta", "enter": "Enter", "return": "Enter", "esc": "Escape", "escape": "Escape",
    "backspace": "Backspace", "tab": "Tab", "space": " ", "delete": "Delete", "del": "Delete", "up": "ArrowUp",
    "down": "ArrowDown", "left": "ArrowLeft", "right": "ArrowRight", "pageup": "PageUp", "pagedown": "PageDown",
    "home": "Home", "end": "End", "insert": "Insert",
}  # fmt: skip
SCROLL_PIXELS = 300
# Resolves false after two animation frames (the page has painted what the action changed), true at the cap.
_TWO_FRAMES = """(capMs) => new Promise((resolve) => {
  const timer = setTimeout(() => resolve(true), capMs);
  requestAnimationFrame(() => requestAnimationFrame(() => { clearTimeout(timer); resolve(false); }));
})"""
CLOSE_TIMEOUT_S = 10.0  # closing waits this long for Playwright; a hung driver must not hold up a shutdown
T = TypeVar("T")
log = logging.getLogger(__name__)


def _key(name: str) -> str:
    if name in KEYS:
        return KEYS[name]
    if len(name) > 1 and name[0] == "f" and name[1:].isdigit():
        return name.upper()
    return name


class BrowserSession:
    """One Chromium with one page per session; `close()` ends the browser and its thread."""

    def __init__(
        self,
        profile_dir: Path,
        width: int = 1280,
        height: int = 800,
        *,
        user: SessionUser | None = None,
        downloads: Path | None = None,
        headless: bool = True,
        launchers: Path | None = None,
    ) -> None:
        """With `user`, Chromium runs confined as that user (see isolation.py), through a launcher script made in
        `launchers` (default: the temporary directory; the manager keeps them under its own root, so a later start
        finds a crashed run's); downloads are saved under their suggested names in `downloads` (default:
        ~/Downloads of the session), where the session's shell sees them."""
        self.width, self.height, self.user, self.launchers = width, height, user, launchers
        self.downloads = downloads or profile_dir.parent / "Downloads"
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="browser")
        try:
            self._call(lambda: self._start(profile_dir, headless))
        except BaseException:
            self._thread.shutdown(wait=True)
            self._remove_launcher()
            raise
        # Playwright's sync API delivers events (downloads, crashes) only while a call runs on its thread; a
        # light periodic call keeps them flowing when nobody is driving the page.
        self._stop_pump = threading.Event()
        self._pump = threading.Thread(target=self._pump_events, name="browser-events", daemon=True)
        self._pump.start()

    def _pump_events(self, every_s: float = 0.2) -> None:
        while not self._stop_pump.wait(every_s):
            try:
                self._call(lambda: self.page.wait_for_timeout(1) if not self.closed else None)
            except Exception:
                pass

    def _call(self, fn: Callable[[], T]) -> T:
        return self._thread.submit(fn).result()

    def _start(self, profile_dir: Path, headless: bool) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        executable = self._confined_chromium(profile_dir) if self.user else CHROMIUM
        # Chromium writes downloads here first: inside the session's home, so both the sandboxed browser and
        # the service (which then saves them under their real names) can reach them.
        incoming = profile_dir / "incoming-downloads"
        self.context = self._playwright.chromium.launch_persistent_context(
            str(profile_dir), executable_path=executable, headless=headless, args=CHROMIUM_ARGS,
            viewport={"width": self.width, "height": self.height}, accept_downloads=True,
            downloads_path=str(incoming),
        )  # fmt: skip
        self._origins: set[str] = set()  # web origins reached (every request's), whose storage `reset` clears
        self.context.on("request", lambda request: self._note_origin(request.url))
        self.context.on("page", lambda page: page.on("download", self._save_download))
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        for page in self.context.pages:
            page.on("download", self._save_download)
        self.closed = False
        self.context.on("close", lambda _: setattr(self, "closed", True))  # Chromium exited or crashed

    def _confined_chromium(self, profile_dir: Path) -> str:
        """A launcher that runs Chromium as the session's user in its sandbox; Playwright talks to it over the
        inherited pipe (fds 3 and 4), which bubblewrap and setpriv keep open."""
        assert self.user is not None
        for path in (profile_dir, profile_dir / "incoming-downloads", self.downloads):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, self.user.uid, self.user.gid)
        # Outside the session's home, in a directory only the service can touch: the session must never be able
        # to replace what the service executes.
        if self.launchers is not None:
            self.launchers.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._launcher_dir = Path(tempfile.mkdtemp(prefix="chromium-launcher-", dir=self.launchers))
        launcher = self._launcher_dir / "chromium"
        command = " ".join(shlex.quote(part) for part in self.user.confine([CHROMIUM], BROWSER_LIMITS))
        launcher.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        launcher.chmod(0o700)
        return str(launcher)

    def _save_download(self, download: Any) -> None:
        """Keep a finished download under its own name where the session (and its shell) can read it."""
        self.downloads.mkdir(parents=True, exist_ok=True)
        target = self.downloads / Path(download.suggested_filename).name
        download.save_as(target)
        if self.user is not None:
            os.chown(target, self.user.uid, self.user.gid)

    def is_alive(self) -> bool:
        return not getattr(self, "closed", True)

    # --- pages ----------------------------------------------------------------------------------------------------

    def new_page(self, url: str | None = None) -> None:
        """Open a fresh page (closing the current one) and make it the one actions go to."""

        def run() -> None:
            old, self.page = self.page, self.context.new_page()
            old.close()
            if url:
                self.page.goto(url)

        self._call(run)

    def reset(self) -> None:
        """Back to what a new session shows, without starting another Chromium (about 2 CPU-seconds saved per
        episode): one blank page (every other page and popup closed), and cookies, granted permissions, the HTTP
        cache and the storage of every origin the session reached cleared. The profile's history stays."""

        def run() -> None:
            fresh = self.context.new_page()
            for page in self.context.pages:
                if page is not fresh:
                    page.close()
            self.page = fresh
            self.context.clear_cookies()
            self.context.clear_permissions()
            cdp = self.context.new_cdp_session(fresh)
            try:
                cdp.send("Network.clearBrowserCache")
                for origin in sorted(self._origins):
                    cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
            finally:
                cdp.detach()
            self._origins.clear()

        self._call(run)

    def _note_origin(self, url: str) -> None:
        """Remember a web origin the session reached, so that `reset` clears its storage."""
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.netloc:
            self._origins.add(f"{parts.scheme}://{parts.netloc}")
        elif parts.scheme == "file":  # Chromium gives every local file one origin, with its own storage
            self._origins.add("file://")

    @property
    def url(self) -> str:
        return self._call(lambda: self.page.url)

    def wait_for_url(self, pattern: str, timeout_s: float = 10.0) -> None:
        """Wait until the page is at a URL matching `pattern` (a glob, e.g. "**/next.html") and loaded."""
        self._call(lambda: self.page.wait_for_url(pattern, timeout=timeout_s * 1000))

    def evaluate(self, script: str) -> Any:
        """Run a JavaScript verifier snippet in the page and return its (JSON-able) value, e.g. `window.score`."""
        return self._call(lambda: self.page.evaluate(script))

    def arm_settle(self) -> None:
        """Nothing to forget: a page's settling is read from its own load state (kept for the desktop's interface)."""

    def settle(self, cap_s: float = CAP_S, *, since_action: bool = False) -> Settled:
        """Wait until the page has loaded (after a navigation an action caused) and painted twice since the action,
        so the next screenshot shows its effect; at most `cap_s` (`since_action`: the desktop's interface)."""
        started = time.monotonic()

        def run() -> bool:
            try:
                self.page.wait_for_load_state("load", timeout=cap_s * 1000)
            except PlaywrightTimeoutError:
                return True
            left_ms = max(1.0, (cap_s - (time.monotonic() - started)) * 1000)
            try:
                return bool(self.page.evaluate(_TWO_FRAMES, left_ms))
            except PlaywrightError:  # the page navigated while we looked: it is loading; one more load wait
                self.page.wait_for_load_state("load", timeout=left_ms)
                return False

        timed_out = self._call(run)
        return Settled(round((time.monotonic() - started) * 1000, 1), timed_out, 0)

    def screenshot(self, size: tuple[int, int] | None = None, fmt: str = "jpeg", quality: int = 80) -> bytes:
        """The page as JPEG or PNG; resized to `size` (width, height) when it differs from the viewport."""
        kwargs: dict[str, Any] = {"type": fmt} | ({"quality": quality} if fmt == "jpeg" else {})
        data = self._call(lambda: self.page.screenshot(**kwargs))
        if size and size != (self.width, self.height):
            image = Image.open(io.BytesIO(data)).convert("RGB").resize(size, Image.Resampling.BILINEAR)
            out = io.BytesIO()
            image.save(out, "JPEG" if fmt == "jpeg" else "PNG")
            data = out.getvalue()
        return data

    # --- actions --------------------------------------------------------------------------------------------------

    def execute(self, action: Action, mapping: ScreenMapping | None = None) -> str:
        """Run one action on the page; model coordinates go through `mapping` (default: viewport pixels)."""
        at = pixel_of(mapping)
        return self._call(lambda: self._execute(action, at))

    def _execute(self, action: Action, at: Callable) -> str:  # type: ignore[type-arg]
        page, mouse, keyboard = self.page, self.page.mouse, self.page.keyboard
        match action:
            case Click(point):
                mouse.click(*at(point))
            case LeftDouble(point):
                mouse.dblclick(*at(point))
            case RightSingle(point):
                mouse.click(*at(point), button="right")
            case Drag(start, end):
                mouse.move(*at(start))
                mouse.down()
                mouse.move(*at(end), steps=10)
                mouse.up()
            case Hotkey(keys):
                keyboard.press("+".join(_key(k) for k in keys))
            case Press(key):
                keyboard.down(_key(key))
            case Release(key):
                keyboard.up(_key(key))
            case Type(content):
                for i, part in enumerate(content.split("\n")):
                    if i:
                        keyboard.press("Enter")
                    if part:
                        keyboard.insert_text(part)
            case Scroll(direction, point):
                if point is not None:
                    mouse.move(*at(point))
                dx = {"left": -SCROLL_PIXELS, "right": SCROLL_PIXELS}.get(direction, 0)
                dy = {"up": -SCROLL_PIXELS, "down": SCROLL_PIXELS}.get(direction, 0)
                mouse.wheel(dx, dy)
            case Navigate(url):
                try:
                    page.goto(url)
                except PlaywrightError as exc:  # an unreachable URL is an observation (Chromium's error page)
                    return f"navigation failed: {str(exc).splitlines()[0]}"
            case NavigateBack():
                page.go_back()
            case Wait():
                time.sleep(1.0)
            case Hover(point):
                mouse.move(*at(point))
            case Finished() | CallUser() | Fail():
                return action.name
            case _:
                raise UnsupportedAction(f"{action.name} is not a browser action")
        return "ok"

    def close(self) -> None:
        """End the browser, Playwright's driver and the worker thread. Tolerant of a browser or driver that already
        died (a Ctrl-C reaches them with the service: TargetClosedError, a closed pipe): what is left is let go."""
        self._stop_pump.set()
        self._pump.join(timeout=5)

        def run() -> None:
            try:
                if not self.closed:
                    self.context.close()
            except Exception as exc:  # already closed or crashed: the state we wanted
                log.info("closing the browser: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            finally:
                self.closed = True
                try:
                    self._playwright.stop()
                except Exception as exc:  # the driver is gone already
                    log.info("stopping Playwright: %s", type(exc).__name__)

        try:
            self._thread.submit(run).result(timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:
            log.warning("the browser did not close within %s s (%s); letting it go", CLOSE_TIMEOUT_S, exc)
        finally:
            self._thread.shutdown(wait=False)
            self._remove_launcher()

    def _remove_launcher(self) -> None:
        if getattr(self, "_launcher_dir", None):
            shutil.rmtree(self._launcher_dir, ignore_errors=True)
