"""`Capture`: records one session (screen, mouse, keyboard, foreground window, audio) into a session directory in the
capture format of docs/in-situ.md. A library as much as the CLI's engine: the server runs it on sandbox X displays.

Threads: the input listener and the window watcher hand events in; a grabber keeps the latest screen frames in memory
(raw, encoded only when an event needs one) and writes the periodic ones; one writer encodes JPEGs and appends
events.jsonl in order. Every event is stamped and queued under one lock, so the file's order is the clock's order.
"""

from __future__ import annotations

import io
import os
import shutil
import threading
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue
from typing import Any

from . import platforms
from .audio import AudioSource
from .errors import CaptureError, RecorderError
from .hotkey import TOGGLE, HotkeyMatcher, parse_hotkey
from .keys import X11_BUTTONS, X11_SCROLL
from .session import FRAMES, EventLog, Session
from .x11 import display_name

SCROLL_DELIVERY_LAG_S = 1.0  # how late recorded events may arrive before a pending scroll is written out


@dataclass(frozen=True)
class Frame:
    """One screen grab, kept raw (BGRA) until an event needs it on disk."""

    seq: int
    grabbed: float  # the capture clock when the grab started
    width: int
    height: int
    pixels: bytes

    def jpeg(self, quality: int) -> bytes:
        from PIL import Image

        image = Image.frombuffer("RGB", (self.width, self.height), self.pixels, "raw", "BGRX", 0, 1)
        out = io.BytesIO()
        image.save(out, "JPEG", quality=quality)
        return out.getvalue()


class FrameBuffer:
    """The last few distinct frames, to pick the one grabbed just before an action."""

    def __init__(self, keep: int = 3) -> None:
        self._frames: deque[Frame] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, frame: Frame) -> None:
        with self._lock:
            self._frames.append(frame)

    def latest(self) -> Frame | None:
        with self._lock:
            return self._frames[-1] if self._frames else None

    def before(self, t: float) -> Frame | None:
        """The newest frame whose grab started no later than `t` (it cannot show the action at `t` yet)."""
        with self._lock:
            for frame in reversed(self._frames):
                if frame.grabbed <= t:
                    return frame
            return self._frames[0] if self._frames else None


@dataclass
class Stats:
    elapsed: float
    events: Counter[str]
    frames: int
    paused: bool
    window: str | None

    @property
    def actions(self) -> int:
        return sum(self.events[k] for k in ("down", "scroll", "key_down"))


@dataclass
class _Pending:
    """Events held back: a thinned pointer move, or scroll notches being merged into one scroll event."""

    kind: str
    events: list[tuple[dict[str, Any], Frame | None]]
    updated: float
    where: tuple[int, int] = (0, 0)


@dataclass
class _Counters:
    events: Counter[str] = field(default_factory=Counter)
    frames: int = 0


class Capture:
    """Record a session into `directory` (a new or empty directory; it becomes a session directory).

    display: the X display to record (default `$DISPLAY`); ignored on macOS and Windows.
    audio: an AudioSource (Microphone, FileAudio) or None for no audio track.
    screenshot_interval: seconds between `periodic` frames (only written when the screen changed); 0 disables them.
    frame_interval: how often the screen is grabbed into memory, for the `pre_action` frame written before every
        down, scroll and key_down.
    move_hz: pointer moves are thinned to at most this rate (the last position before any other event is kept).
    scroll_gap: wheel notches at one position less than this many seconds apart merge into one scroll event.
    hotkey: e.g. "ctrl+alt+p" to pause/resume from the keyboard; None (the default) for no hotkey.
    task_id, instruction, platform, session_id: written into session.json (platform defaults to this machine's:
        pass "sandbox" when recording a sandbox display).
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        display: str | None = None,
        audio: AudioSource | None = None,
        screenshot_interval: float = 1.0,
        frame_interval: float = 0.15,
        move_hz: float = 30.0,
        scroll_gap: float = 0.25,
        hotkey: str | None = None,
        task_id: int | None = None,
        instruction: str | None = None,
        platform: str | None = None,
        session_id: str | None = None,
        jpeg_quality: int = 80,
    ) -> None:
        self.path = Path(directory)
        self.display = display
        self.audio = audio
        self.screenshot_interval = max(0.0, screenshot_interval)
        self.frame_interval = max(0.02, frame_interval)
        self.move_interval = 1.0 / move_hz if move_hz > 0 else 0.0
        self.scroll_gap = scroll_gap
        self.hotkey = parse_hotkey(hotkey) if hotkey else None
        self.task_id, self.instruction, self.platform, self.session_id = task_id, instruction, platform, session_id
        self.jpeg_quality = jpeg_quality
        self.session: Session | None = None
        self.started_wall: float | None = None
        self.warnings: list[str] = []

        self._lock = threading.RLock()
        self._stop_lock = threading.Lock()
        self._queue: Queue[tuple[dict[str, Any], Frame | None] | None] = Queue()
        self._frames = FrameBuffer()
        self._counters = _Counters()
        self._t0 = 0.0
        self._started = self._stopping = self._stopped = self._paused = False
        self._last_t = 0.0
        self._last_move_t = -1e9
        self._last_periodic = -1e9
        self._last_shot_seq = -1
        self._pending: _Pending | None = None
        self._buttons_down: set[int] = set()
        self._keys_down: dict[int, str] = {}
        self._matcher = HotkeyMatcher(self.hotkey) if self.hotkey else None
        self._window: tuple[int, str] | None = None
        self._error: BaseException | None = None
        self._wake = threading.Event()
        self._first_frame = threading.Event()
        self._resume_requested = threading.Event()
        self._resume_done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._input: platforms.Source | None = None
        self._windows: platforms.Source | None = None
        self._log: EventLog | None = None
        self._to_pixels = (1.0, 0, 0)  # factor, left, top: pynput's coordinates -> screen pixels

    # --- public API -------------------------------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds on the events' clock (monotonic, 0 at start())."""
        return time.monotonic() - self._t0

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    @property
    def error(self) -> BaseException | None:
        """The first failure of a part of the capture (X display gone, disk full, ...), or None."""
        for part in (self, self._input, self._windows, self.audio):
            error = self._error if part is self else getattr(part, "error", None)
            if error is not None:
                return error
        return None

    def stats(self) -> Stats:
        return Stats(
            elapsed=self.now() if self._started else 0.0,
            events=Counter(self._counters.events),
            frames=self._counters.frames,
            paused=self._paused,
            window=self._window[1] if self._window else None,
        )

    def start(self) -> Capture:
        """Create the session and start recording; raises CaptureError (or AudioError) and cleans up on failure."""
        if self._started:
            raise CaptureError("this capture was already started")
        existed = self.path.exists()
        self.session = Session.create(
            self.path,
            session_id=self.session_id,
            task_id=self.task_id,
            instruction=self.instruction,
            platform=self.platform,
        )
        self._t0 = time.monotonic()
        self.started_wall = time.time()
        try:
            self._start()
        except BaseException as exc:
            self._teardown()
            if existed:  # it was empty: empty it again
                for child in self.path.iterdir():
                    if child.is_dir():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
            else:
                shutil.rmtree(self.path, ignore_errors=True)
            if isinstance(exc, RecorderError) or not isinstance(exc, Exception):
                raise
            raise CaptureError(f"the capture could not start: {exc}") from exc
        return self

    def pause(self) -> None:
        """Stop capturing until resume(): a `pause` event, then nothing (no input, frames, titles; audio silent)."""
        with self._lock:
            if not self._started or self._stopping or self._paused:
                return
            self._flush_pending()
            self._push([(self._event("pause", self.now()), None)])
            self._paused = True
            self._resume_requested.clear()
            if self.audio is not None:
                self.audio.pause()

    def resume(self, wait: bool = True) -> None:
        """Capture again: a fresh frame is grabbed first, then the `resume` event and the current window title."""
        with self._lock:
            if not self._started or self._stopping or not self._paused:
                return
            self._resume_done.clear()
            self._resume_requested.set()
        self._wake.set()
        if wait:
            self._resume_done.wait(5.0)

    def toggle_pause(self) -> None:
        if self._paused:
            self.resume(wait=False)
        else:
            self.pause()

    def stop(self) -> Session:
        """Stop every part, write what is pending, finish session.json and the audio; returns the session.

        Every input event the X server processed before this call is recorded, even one still on its way to the
        listener (input injected just before stop() is not lost; see X11Input.stop)."""
        if self.session is None:
            raise CaptureError("this capture was never started")
        with self._stop_lock:  # a second stop() waits for the first one
            if not self._stopped:
                self._teardown()
        return self.session

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.session is not None and not self._stopped:
            self.stop()

    # --- lifecycle --------------------------------------------------------------------------------------------------

    def _start(self) -> None:
        assert self.session is not None
        platforms.make_dpi_aware()
        if platforms.IS_X11:
            from .x11 import screen_info

            width, height, scale = screen_info(self.display)
        self._log = EventLog(self.session.events_path)
        self.session.mark_recording()
        self._spawn(self._write_loop, "capture-writer")
        self._spawn(self._grab_loop, "capture-grabber")
        if not self._first_frame.wait(10.0) or self._error is not None:
            raise CaptureError(f"cannot grab the screen: {self._error or 'no frame within 10 s'}")
        if not platforms.IS_X11:
            width, height, scale = self._screen_from_frames()
        self.session.update_meta(
            screen={"width": width, "height": height, "scale": scale}, started_wall=round(self.started_wall or 0, 6)
        )
        self._started = True  # from here on, events are recorded
        self._windows = platforms.window_source(self.display, self._on_window)
        if self._windows is not None:
            try:
                self._windows.start()
            except RecorderError as exc:  # titles are a nicety: record without them
                self.warnings.append(f"window titles are not recorded: {exc}")
                self._windows = None
        self._input = platforms.input_source(self.display, self._on_motion, self._on_button, self._on_key, self._pixels)
        self._input.start()
        if self.audio is not None:
            self.audio.start(self.session.path, self.now)
            self._write_audio_meta()

    def _screen_from_frames(self) -> tuple[int, int, float]:
        frame = self._frames.latest()
        monitor = getattr(self, "_monitor", None)
        assert frame is not None and monitor is not None
        factor = frame.width / monitor["width"] if monitor["width"] else 1.0
        self._to_pixels = (factor, monitor["left"], monitor["top"])
        return frame.width, frame.height, round(factor, 3)

    def _pixels(self, x: float, y: float) -> tuple[int, int]:
        factor, left, top = self._to_pixels
        return round((x - left) * factor), round((y - top) * factor)

    def _write_audio_meta(self) -> None:
        if self.session is not None and self.audio is not None and self.audio.file:
            offset = round(self.audio.offset, 6) if self.audio.offset is not None else None
            self.session.update_meta(audio={"file": self.audio.file, "offset": offset})

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _teardown(self) -> None:
        """Stop the sources, then the grabber, then drain the writer; safe on a half-started capture.

        The input source stops first and while the capture is still recording: stopping it hands over the events
        still on their way (X RECORD's remaining data), and those belong to the session like any other."""
        if self._input is not None:
            try:
                self._input.stop()
            except Exception:
                pass
        with self._lock:
            self._stopping = True
        if self._windows is not None:
            try:
                self._windows.stop()
            except Exception:
                pass
        self._wake.set()
        for thread in self._threads:
            if thread.name == "capture-grabber":
                thread.join(10.0)
        with self._lock:
            self._flush_pending()
        if self.audio is not None and self._started:
            try:
                self.audio.stop()
                self._write_audio_meta()
            except Exception as exc:
                self._fail(exc)
        self._queue.put(None)
        for thread in self._threads:
            thread.join(30.0)
        if self._log is not None:
            self._log.close()
        if self.session is not None:
            if self._started:  # how long it ran (events may end earlier); the recorder's own note, not uploaded
                self.session.write_local("capture", {"duration": round(self.now(), 3), "stopped_wall": time.time()})
            self.session.unmark_recording()
        self._stopped = True

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    # --- events -----------------------------------------------------------------------------------------------------

    def _recording(self) -> bool:
        return self._started and not self._stopping and not self._paused

    def _event(self, kind: str, t: float, **fields: Any) -> dict[str, Any]:
        """An event at `t` on the capture's clock; `wall` is the Unix time at that moment (it may have been earlier
        than now: input events carry their own time)."""
        return {"type": kind, "t": t, "wall": round(time.time() - (self.now() - t), 6), **fields}

    def _push(self, events: list[tuple[dict[str, Any], Frame | None]]) -> None:
        """Queue events for the writer, in order, with non-decreasing t (call with the lock held)."""
        for event, frame in events:
            t = max(float(event["t"]), self._last_t)
            self._last_t = t
            event["t"] = round(t, 6)
            if frame is not None:
                self._last_shot_seq = frame.seq
            self._queue.put((event, frame))

    def _flush_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._push(pending.events)

    def _flush_stale(self) -> None:
        with self._lock:
            pending = self._pending
            if pending is None:
                return
            # A scroll waits a second longer than its gap: notches merge by their X timestamps, and the server may
            # hand them over late, in a batch; flushing the first one early would split one wheel turn in two.
            limit = self.move_interval if pending.kind == "move" else self.scroll_gap + SCROLL_DELIVERY_LAG_S
            if self.now() - pending.updated > limit:
                self._flush_pending()

    def _pre_action(self, t: float) -> list[tuple[dict[str, Any], Frame | None]]:
        frame = self._frames.before(t)
        if frame is None:
            return []
        return [(self._event("screenshot", t, file=None, reason="pre_action"), frame)]

    def _at(self, when: float) -> float:
        """An input event's time (time.monotonic()'s clock) on the capture's clock."""
        return when - self._t0

    def _on_motion(self, x: int, y: int, when: float) -> None:
        with self._lock:
            if not self._recording():
                return
            t = self._at(when)
            if self._pending is not None and self._pending.kind != "move":
                self._flush_pending()
            move = (self._event("move", t, x=x, y=y), None)
            if t - self._last_move_t >= self.move_interval:
                self._pending = None  # superseded by this newer position
                self._last_move_t = t
                self._push([move])
            else:
                self._pending = _Pending("move", [move], t)

    def _on_button(self, pressed: bool, button: int, x: int, y: int, when: float) -> None:
        with self._lock:
            if not self._recording():
                if not pressed:
                    self._buttons_down.discard(button)
                return
            t = self._at(when)
            if button in X11_SCROLL:
                if pressed:
                    self._on_scroll(t, x, y, *X11_SCROLL[button])
                return
            name = X11_BUTTONS.get(button)
            if name is None:  # back/forward and other extra buttons: not in the format's vocabulary
                return
            self._flush_pending()
            if pressed:
                self._buttons_down.add(button)
                self._push([*self._pre_action(t), (self._event("down", t, x=x, y=y, button=name), None)])
            elif button in self._buttons_down:
                self._buttons_down.discard(button)
                self._push([(self._event("up", t, x=x, y=y, button=name), None)])

    def _on_scroll(self, t: float, x: int, y: int, dx: int, dy: int) -> None:
        pending = self._pending
        if pending is not None and pending.kind == "scroll" and pending.where == (x, y):
            if t - pending.updated <= self.scroll_gap:
                scroll = pending.events[-1][0]
                scroll["dx"] += dx
                scroll["dy"] += dy
                pending.updated = t
                return
        self._flush_pending()
        events = [*self._pre_action(t), (self._event("scroll", t, x=x, y=y, dx=dx, dy=dy), None)]
        self._pending = _Pending("scroll", events, t, (x, y))

    def _on_key(self, pressed: bool, code: int, key: str | None, when: float) -> None:
        verdict = ""
        with self._lock:
            if self._matcher is not None:
                if pressed:
                    verdict = self._matcher.press(code, key)
                else:
                    self._matcher.release(code)
            if verdict or not self._started:
                pass  # the hotkey's key is never recorded (and a held one's auto-repeat does not toggle again)
            elif pressed:
                if self._recording() and key is not None:
                    t = self._at(when)
                    self._flush_pending()
                    self._keys_down[code] = key
                    self._push([*self._pre_action(t), (self._event("key_down", t, key=key), None)])
            else:
                down = self._keys_down.pop(code, None)  # a release is recorded only after its recorded press
                if down is not None and self._recording():
                    self._flush_pending()
                    self._push([(self._event("key_up", self._at(when), key=down), None)])
        if verdict == TOGGLE:
            self.toggle_pause()

    def _on_window(self, window: int, title: str) -> None:
        with self._lock:
            self._window = (window, title)
            if self._recording():
                self._flush_pending()
                self._push([(self._event("window", self.now(), title=title), None)])

    # --- frames -----------------------------------------------------------------------------------------------------

    def _grab_loop(self) -> None:
        try:
            import mss

            kwargs = {"display": display_name(self.display)} if platforms.IS_X11 else {}
            with mss.MSS(**kwargs) as grabber:
                monitor = dict(grabber.monitors[0])  # the whole virtual screen
                self._monitor = monitor
                last: Frame | None = None
                while not self._stopping:
                    if self._paused and not self._resume_requested.is_set():
                        self._wake.wait(self.frame_interval)
                        self._wake.clear()
                        continue
                    t = self.now()
                    shot = grabber.grab(monitor)
                    pixels = bytes(shot.raw)
                    if last is None or pixels != last.pixels:
                        last = Frame((last.seq + 1) if last else 1, t, shot.width, shot.height, pixels)
                        self._frames.add(last)
                    self._first_frame.set()
                    if self._resume_requested.is_set():
                        self._finish_resume()
                    self._periodic()
                    self._flush_stale()
                    self._wake.wait(self.frame_interval)
                    self._wake.clear()
        except Exception as exc:
            self._fail(exc)
        finally:
            self._first_frame.set()

    def _finish_resume(self) -> None:
        with self._lock:
            self._resume_requested.clear()
            if self._paused and not self._stopping:
                self._paused = False
                self._push([(self._event("resume", self.now()), None)])
                if self.audio is not None:
                    self.audio.resume()
                if self._window is not None:
                    self._push([(self._event("window", self.now(), title=self._window[1]), None)])
        self._resume_done.set()

    def _periodic(self) -> None:
        if not self.screenshot_interval:
            return
        with self._lock:
            if not self._recording():
                return
            t = self.now()
            if t - self._last_periodic < self.screenshot_interval:
                return
            self._last_periodic = t
            frame = self._frames.latest()
            if frame is None or frame.seq == self._last_shot_seq:
                return  # the screen has not changed since the last frame written
            self._flush_pending()
            self._push([(self._event("screenshot", t, file=None, reason="periodic"), frame)])

    # --- writing ----------------------------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        assert self.session is not None and self._log is not None
        frames_dir = self.session.frames_dir
        written: OrderedDict[int, str] = OrderedDict()  # frame seq -> file: an unchanged screen is written once
        while (item := self._queue.get()) is not None:
            event, frame = item
            try:
                if frame is not None:
                    name = written.get(frame.seq)
                    if name is None:
                        self._counters.frames += 1
                        name = f"{FRAMES}/{self._counters.frames:06d}.jpg"
                        tmp = frames_dir / f".{self._counters.frames:06d}.jpg.tmp"
                        tmp.write_bytes(frame.jpeg(self.jpeg_quality))
                        os.replace(tmp, self.session.path / name)
                        written[frame.seq] = name
                        while len(written) > 16:
                            written.popitem(last=False)
                    event["file"] = name
                self._log.append(event)
                self._counters.events[event["type"]] += 1
            except Exception as exc:
                self._fail(exc)
