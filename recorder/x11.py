"""X11 capture through python-xlib: every client's mouse and keyboard events via the RECORD extension, the foreground
window's title via EWMH (`_NET_ACTIVE_WINDOW`, `_NET_WM_NAME`), and the screen's size and scale.

Each piece opens its own connections to the display it is given, so several captures of different displays can run
in one process (the server records sandbox displays this way) and nothing depends on `$DISPLAY` being set.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import CaptureError
from .keys import x11_key

# Every input handler gets, last, when the event happened on time.monotonic()'s clock.
MotionHandler = Callable[[int, int, float], None]  # x, y, when
ButtonHandler = Callable[[bool, int, int, int, float], None]  # pressed, X button number, x, y, when
KeyHandler = Callable[[bool, int, str | None, float], None]  # pressed, keycode, key name or character, when
WindowHandler = Callable[[int, str], None]  # window id, title


def display_name(display: str | None) -> str:
    name = display or os.environ.get("DISPLAY")
    if not name:
        raise CaptureError("no X display: set DISPLAY or pass --display (e.g. --display :0)")
    return name


def open_display(display: str | None) -> Any:
    """A python-xlib connection, or a CaptureError saying which display could not be opened and why."""
    from Xlib import display as xdisplay

    name = display_name(display)
    try:
        return xdisplay.Display(name)
    except Exception as exc:
        raise CaptureError(f"cannot open X display {name}: {exc or type(exc).__name__}") from exc


def screen_info(display: str | None) -> tuple[int, int, float]:
    """(width, height, scale) of the display's screen; scale is the UI scale (Xft.dpi / 96), 1.0 when unset.
    Event coordinates on X11 are already physical pixels of this screen."""
    dpy = open_display(display)
    try:
        screen = dpy.screen()
        scale = 1.0
        resources = screen.root.get_full_property(dpy.intern_atom("RESOURCE_MANAGER"), 0)
        if resources is not None:
            text = resources.value.decode() if isinstance(resources.value, bytes) else str(resources.value)
            if match := re.search(r"^Xft\.dpi:\s*([0-9.]+)", text, re.M):
                scale = round(float(match.group(1)) / 96.0, 3) or 1.0
        return int(screen.width_in_pixels), int(screen.height_in_pixels), scale
    finally:
        dpy.close()


class ServerClock:
    """The X server's event timestamps (milliseconds, wrapping at 2**32) on time.monotonic()'s clock.

    The server may hand recorded events over in batches (auto-repeat presses wait for the next flush), so when an
    event arrives says little about when it happened; its own timestamp does. The offset between the clocks is the
    smallest seen (the least-delayed event), so a mapped time is never later than its arrival.
    """

    RESYNC_S = 30.0  # a larger apparent delay means the server's clock jumped: take the new offset

    def __init__(self) -> None:
        self.offset: float | None = None
        self._last_ms: int | None = None
        self._wraps = 0

    def __call__(self, server_ms: int, arrived: float) -> float:
        if self._last_ms is not None and server_ms < self._last_ms - 2**31:
            self._wraps += 1
        self._last_ms = server_ms
        server = (server_ms + self._wraps * 2**32) / 1000.0
        delay = arrived - server
        if self.offset is None or delay < self.offset or delay - self.offset > self.RESYNC_S:
            self.offset = delay
        return server + self.offset


class X11Input:
    """Mouse and keyboard events of all clients on one display (XRECORD device events, injected ones included)."""

    def __init__(self, display: str | None, on_motion: MotionHandler, on_button: ButtonHandler, on_key: KeyHandler):
        self.display = display_name(display)
        self.on_motion, self.on_button, self.on_key = on_motion, on_button, on_key
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._clock = ServerClock()

    def start(self, timeout: float = 5.0) -> None:
        from Xlib import X
        from Xlib.ext import record

        self._record = open_display(self.display)
        self._control = open_display(self.display)
        self._lookup = open_display(self.display)
        if not self._record.has_extension("RECORD"):
            self.close()
            raise CaptureError(f"the X server of {self.display} has no RECORD extension: input cannot be captured")
        self._context = self._record.record_create_context(
            0,
            [record.AllClients],
            [
                {
                    "core_requests": (0, 0), "core_replies": (0, 0), "ext_requests": (0, 0, 0, 0),
                    "ext_replies": (0, 0, 0, 0), "delivered_events": (0, 0),
                    "device_events": (X.KeyPress, X.MotionNotify), "errors": (0, 0),
                    "client_started": False, "client_died": False,
                }
            ],
        )  # fmt: skip
        self._thread = threading.Thread(target=self._run, name=f"x11-input {self.display}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise CaptureError(f"the input listener on {self.display} did not start within {timeout} s")
        if self.error is not None:
            raise CaptureError(f"the input listener on {self.display} failed: {self.error}")

    def _run(self) -> None:
        from Xlib.protocol import rq

        parser = rq.EventField(None)

        def handle(reply: Any) -> None:
            from Xlib.ext import record

            if reply.category == record.StartOfData:
                self._ready.set()
                return
            if reply.category != record.FromServer or reply.client_swapped or not reply.data:
                return
            data = reply.data
            while data and len(data) >= 32:
                event, data = parser.parse_binary_value(data, self._record.display, None, None)
                try:
                    self._dispatch(event)
                except Exception as exc:  # a handler's bug must not silently kill the listener
                    self.error = exc

        try:
            self._record.record_enable_context(self._context, handle)
        except Exception as exc:
            self.error = exc
        finally:
            self._ready.set()

    def _dispatch(self, event: Any) -> None:
        from Xlib import X

        kind = event.type
        when = self._clock(event.time, time.monotonic())
        if kind == X.MotionNotify:
            self.on_motion(event.root_x, event.root_y, when)
        elif kind in (X.ButtonPress, X.ButtonRelease):
            self.on_button(kind == X.ButtonPress, event.detail, event.root_x, event.root_y, when)
        elif kind in (X.KeyPress, X.KeyRelease):
            self._refresh_keymap()
            self.on_key(kind == X.KeyPress, event.detail, x11_key(self._keysym(event.detail, event.state)), when)

    def _refresh_keymap(self) -> None:
        """Apply keymap changes (MappingNotify, sent to every client) before translating a key."""
        from Xlib import X

        while self._lookup.pending_events():
            event = self._lookup.next_event()
            if event.type == X.MappingNotify and event.request == X.MappingKeyboard:
                self._lookup.refresh_keyboard_mapping(event)

    def _keysym(self, keycode: int, state: int) -> int:
        """The keysym a key press produces given the modifier state before it (shift, caps lock, num lock, AltGr)."""
        from Xlib import XK, X

        lookup = self._lookup.keycode_to_keysym
        base, shifted = lookup(keycode, 0), lookup(keycode, 1)
        shift, lock = bool(state & X.ShiftMask), bool(state & X.LockMask)
        if state & X.Mod5Mask and (level3 := lookup(keycode, 5 if shift else 4)):  # AltGr (ISO_Level3_Shift)
            return level3
        if not shifted:
            return base
        if 0xFF80 <= shifted <= 0xFFBD:  # a keypad key: num lock picks its digit
            return shifted if bool(state & X.Mod2Mask) != shift else base
        lower, upper = XK.keysym_to_string(base) or "", XK.keysym_to_string(shifted) or ""
        if len(lower) == 1 and lower.isalpha() and upper == lower.upper():
            return shifted if shift != lock else base
        return shifted if shift else base

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening once every event the server recorded before this call has been dispatched.

        The server keeps recorded data in a buffer until it flushes it to the data connection, and the listener
        thread may not have parsed what already arrived. Disabling the context on the control connection makes the
        server flush that buffer and then send EndOfData, so every event it processed before the disable request
        comes first: all input injected (XTEST, as xdotool and x11vnc do) before this call, once the server has read
        the injecting client's request. The sync makes sure the disable request was processed, and the thread keeps
        dispatching until EndOfData ends record_enable_context; only then is the context freed (close())."""
        if self._thread is not None and self._thread.is_alive():
            try:
                self._control.record_disable_context(self._context)
                self._control.sync()
            except Exception:
                pass
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        if hasattr(self, "_context"):
            try:
                self._control.record_free_context(self._context)
                self._control.flush()
            except Exception:
                pass
            del self._context
        for name in ("_record", "_control", "_lookup"):
            dpy = self.__dict__.pop(name, None)
            if dpy is not None:
                try:
                    dpy.close()
                except Exception:
                    pass


class X11Windows:
    """Reports the foreground window (id, title) whenever it or its title changes (EWMH window managers)."""

    def __init__(self, display: str | None, on_window: WindowHandler) -> None:
        self.display = display_name(display)
        self.on_window = on_window
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watched = 0
        self.current: tuple[int, str] | None = None

    def start(self) -> None:
        from Xlib import X

        self._dpy = open_display(self.display)
        self._root = self._dpy.screen().root
        self._atoms = {name: self._dpy.intern_atom(name) for name in ("_NET_ACTIVE_WINDOW", "_NET_WM_NAME", "WM_NAME")}
        self._utf8 = self._dpy.intern_atom("UTF8_STRING")
        self._root.change_attributes(event_mask=X.PropertyChangeMask)
        self._dpy.sync()
        self._check()
        self._thread = threading.Thread(target=self._run, name=f"x11-windows {self.display}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from Xlib import X

        fd = self._dpy.fileno()
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([fd], [], [], 0.2)
                if not readable and not self._dpy.pending_events():
                    continue
                changed = False
                while self._dpy.pending_events():
                    event = self._dpy.next_event()
                    if event.type != X.PropertyNotify:
                        continue
                    if event.window == self._root and event.atom == self._atoms["_NET_ACTIVE_WINDOW"]:
                        changed = True
                    elif event.window.id == self._watched and event.atom in (
                        self._atoms["_NET_WM_NAME"],
                        self._atoms["WM_NAME"],
                    ):
                        changed = True
                if changed:
                    self._check()
        except Exception as exc:
            self.error = exc

    def _check(self) -> None:
        from Xlib import X

        active = self._active()
        if active is None:
            return
        if active != self._watched:
            window = self._dpy.create_resource_object("window", active)
            window.change_attributes(event_mask=X.PropertyChangeMask, onerror=lambda *args: None)
            self._watched = active
        title = self._title(active)
        if (active, title) != self.current:
            self.current = (active, title)
            self.on_window(active, title)

    def _active(self) -> int | None:
        from Xlib import X

        prop = self._root.get_full_property(self._atoms["_NET_ACTIVE_WINDOW"], X.AnyPropertyType)
        if prop is None or not len(prop.value) or not prop.value[0]:
            return None
        return int(prop.value[0])

    def _title(self, window_id: int) -> str:
        from Xlib import X

        window = self._dpy.create_resource_object("window", window_id)
        try:
            prop = window.get_full_property(self._atoms["_NET_WM_NAME"], self._utf8)
            if prop is None or not prop.value:
                prop = window.get_full_property(self._atoms["WM_NAME"], X.AnyPropertyType)
        except Exception:  # the window went away between the notification and the question
            return ""
        if prop is None:
            return ""
        value = prop.value
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        dpy = self.__dict__.pop("_dpy", None)
        if dpy is not None:
            try:
                dpy.close()
            except Exception:
                pass
