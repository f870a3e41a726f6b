"""Input and foreground-window sources per platform: X11 (python-xlib, see x11.py) on Linux; pynput listeners and a
polled foreground-window title on macOS and Windows. All of them report through the same handlers, X11-style
(button numbers 1-3, scroll as buttons 4-7), so the capture logic is written once."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .errors import CaptureError
from .keys import pynput_key
from .x11 import ButtonHandler, KeyHandler, MotionHandler, WindowHandler

IS_X11 = sys.platform.startswith("linux") or sys.platform.startswith("freebsd")


class Source(Protocol):
    error: BaseException | None

    def start(self) -> None: ...

    def stop(self) -> None: ...


def input_source(
    display: str | None,
    on_motion: MotionHandler,
    on_button: ButtonHandler,
    on_key: KeyHandler,
    to_pixels: Callable[[float, float], tuple[int, int]],
) -> Source:
    if IS_X11:
        from .x11 import X11Input

        return X11Input(display, on_motion, on_button, on_key)
    return PynputInput(on_motion, on_button, on_key, to_pixels)


def window_source(display: str | None, on_window: WindowHandler) -> Source | None:
    """The foreground-window watcher of this platform, or None where there is none (macOS)."""
    if IS_X11:
        from .x11 import X11Windows

        return X11Windows(display, on_window)
    if sys.platform == "win32":
        return PolledWindows(_win32_foreground, on_window)
    return None


class PynputInput:
    """pynput's mouse and keyboard listeners (macOS needs the Accessibility / Input Monitoring permission)."""

    BUTTONS = {"left": 1, "middle": 2, "right": 3}

    def __init__(
        self,
        on_motion: MotionHandler,
        on_button: ButtonHandler,
        on_key: KeyHandler,
        to_pixels: Callable[[float, float], tuple[int, int]],
    ) -> None:
        self.on_motion, self.on_button, self.on_key, self.to_pixels = on_motion, on_button, on_key, to_pixels
        self.error: BaseException | None = None
        self._listeners: list[Any] = []

    def start(self) -> None:
        try:
            from pynput import keyboard, mouse
        except Exception as exc:
            raise CaptureError(f"cannot capture input on this system (pynput: {exc})") from exc
        listeners = [
            mouse.Listener(on_move=self._move, on_click=self._click, on_scroll=self._scroll),
            keyboard.Listener(on_press=self._press, on_release=self._release),
        ]
        for listener in listeners:
            listener.start()
            listener.wait()
            self._listeners.append(listener)

    def _guard(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:
            self.error = exc

    def _move(self, x: float, y: float) -> None:
        when = time.monotonic()
        self._guard(lambda: self.on_motion(*self.to_pixels(x, y), when))

    def _click(self, x: float, y: float, button: Any, pressed: bool) -> None:
        number = self.BUTTONS.get(getattr(button, "name", ""), 0)
        if number:
            when = time.monotonic()
            self._guard(lambda: self.on_button(pressed, number, *self.to_pixels(x, y), when))

    def _scroll(self, x: float, y: float, dx: int, dy: int) -> None:
        px, py = self.to_pixels(x, y)
        when = time.monotonic()
        notches = [(4 if dy > 0 else 5, abs(int(dy))), (7 if dx > 0 else 6, abs(int(dx)))]
        for button, count in notches:
            for _ in range(count):
                self._guard(lambda b=button: self.on_button(True, b, px, py, when))

    def _code(self, key: Any) -> int:
        vk = getattr(key, "vk", None)
        if vk is None and getattr(key, "value", None) is not None:
            vk = getattr(key.value, "vk", None)
        return int(vk) if vk is not None else hash(str(key)) & 0x7FFFFFFF

    def _press(self, key: Any) -> None:
        when = time.monotonic()
        self._guard(lambda: self.on_key(True, self._code(key), pynput_key(key), when))

    def _release(self, key: Any) -> None:
        when = time.monotonic()
        self._guard(lambda: self.on_key(False, self._code(key), pynput_key(key), when))

    def stop(self) -> None:
        for listener in self._listeners:
            listener.stop()
        for listener in self._listeners:
            listener.join(5.0)
        self._listeners.clear()


class PolledWindows:
    """Asks `foreground()` for the (id, title) of the foreground window twice a second; reports changes."""

    def __init__(self, foreground: Callable[[], tuple[int, str] | None], on_window: WindowHandler) -> None:
        self.foreground, self.on_window = foreground, on_window
        self.error: BaseException | None = None
        self.current: tuple[int, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._poll()
        self._thread = threading.Thread(target=self._run, name="foreground-window", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        window = self.foreground()
        if window is not None and window != self.current:
            self.current = window
            self.on_window(*window)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._poll()
            except Exception as exc:
                self.error = exc
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


def _win32_foreground() -> tuple[int, str] | None:
    import ctypes

    user32 = ctypes.windll.user32  # type: ignore[attr-defined]
    handle = user32.GetForegroundWindow()
    if not handle:
        return None
    length = user32.GetWindowTextLengthW(handle)
    buffer = ctypes.create_unicode_buffer(length + 1)
    user32.GetWindowTextW(handle, buffer, length + 1)
    return int(handle), buffer.value


def make_dpi_aware() -> None:
    """On Windows, ask for physical-pixel coordinates (pynput and mss then agree with the screen's pixels)."""
    if sys.platform != "win32":
        return
    try:
        import ctypes

        ctypes.windll.shcore.SetProcessDpiAwareness(2)  # type: ignore[attr-defined]
    except Exception:
        pass
