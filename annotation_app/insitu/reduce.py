"""Raw input events -> UI-TARS actions: clicks, double and right clicks, drags, scrolls with their amount, typed text
merged across keystrokes (backspace applied) and hotkeys, each with its key frame.

One pass over the ordered events with a small state machine; moves are skipped almost for free, so long sessions
(mostly pointer motion) reduce at well over 200,000 events/s (bench/insitu.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from sandbox.actions import (
    MAX_HOTKEY_KEYS,
    Action,
    Click,
    Drag,
    Hotkey,
    LeftDouble,
    Point,
    RightSingle,
    Scroll,
    Type,
    action_to_dict,
    format_action,
)

MODIFIERS = ("ctrl", "alt", "shift", "cmd")  # the order hotkeys list them in
# AltGr (ISO_Level3_Shift) selects the third level of a key: the recorder reports the character it produced ("@"),
# which is typed text. It is no chord modifier, so it never reaches a hotkey (folding it into alt typed "alt @").
LEVEL_SHIFTS = ("altgr",)
KEY_ALIASES = {
    "control": "ctrl", "return": "enter", "escape": "esc", "super": "cmd", "win": "cmd", "meta": "cmd",
    "windows": "cmd", "command": "cmd", "option": "alt", "alt_gr": "altgr", "iso_level3_shift": "altgr",
    "mode_switch": "altgr", "del": "delete",
    "pgup": "pageup", "page_up": "pageup", "pgdn": "pagedown", "page_down": "pagedown", "ins": "insert",
    "arrowup": "up", "arrowdown": "down", "arrowleft": "left", "arrowright": "right", "spacebar": "space",
}  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """Thresholds of the reduction; the defaults follow common desktop settings."""

    double_click_s: float = 0.5  # second press within this long of the first release...
    double_click_px: float = 6.0  # ...and this close makes a double click
    drag_px: float = 8.0  # a press released farther than this from where it started is a drag
    scroll_gap_s: float = 1.0  # wheel notches closer than this in time...
    scroll_px: float = 64.0  # ...and space merge into one scroll
    lone_modifier_keys: tuple[str, ...] = ("cmd",)  # modifiers that are an action when tapped alone (the menu key)


@dataclass(slots=True)
class ReducedAction:
    """One action with the time span of the events it came from (seconds on the capture's monotonic clock)."""

    action: Action
    start: float
    end: float
    amount: int = 1  # scroll notches; keystrokes for typing
    frame: str | None = None  # the key frame: the screenshot the action was taken on
    frame_stale: bool = False  # no screenshot was taken after the previous action: the frame may predate its result
    window: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return format_action(self.action)

    def to_json(self) -> dict[str, Any]:
        data = action_to_dict(self.action)
        if isinstance(self.action, Scroll):
            data["amount"] = self.amount
        return data


@dataclass
class Reduction:
    actions: list[ReducedAction]
    warnings: list[str]
    events: int


def key_name(raw: str) -> str:
    """The reducer's name for a key: characters stay as they are, names are lowercase without a side suffix."""
    if len(raw) == 1:
        return raw
    name = raw.lower().replace("-", "_")
    for side in ("_l", "_r"):
        if name.endswith(side) and len(name) > 2:
            name = name[: -len(side)]
    return KEY_ALIASES.get(name, name)


def _direction(dx: float, dy: float) -> tuple[str, int]:
    if abs(dy) >= abs(dx):
        return ("up" if dy > 0 else "down"), max(1, round(abs(dy)))
    return ("right" if dx > 0 else "left"), max(1, round(abs(dx)))


class _Reducer:
    def __init__(self, settings: Settings):
        self.s = settings
        self.out: list[ReducedAction] = []
        self.warnings: list[str] = []
        self.held: list[str] = []  # modifiers down, in press order
        self.lone: str | None = None  # a modifier pressed with nothing else since
        self.typed: list[str] = []
        self.typed_start = self.typed_end = 0.0
        self.keystrokes = 0
        self.press: dict[str, Any] | None = None  # the mouse press waiting for its release
        self.last_click: tuple[float, float, float] | None = None  # x, y, release time of the last plain left click
        self.window = ""

    # --- output ---------------------------------------------------------------------------------------------------
    def emit(self, action: Action, start: float, end: float, **kw: Any) -> ReducedAction:
        reduced = ReducedAction(action, start, end, window=self.window, **kw)
        self.out.append(reduced)
        return reduced

    def flush_typing(self) -> None:
        if self.typed:
            self.emit(Type("".join(self.typed)), self.typed_start, self.typed_end, amount=self.keystrokes)
            self.typed.clear()
        self.keystrokes = 0

    def modifiers(self, *, without_shift: bool = False) -> list[str]:
        held = set(self.held)
        return [m for m in MODIFIERS if m in held and not (without_shift and m == "shift")]

    # --- mouse ----------------------------------------------------------------------------------------------------
    def down(self, e: dict[str, Any]) -> None:
        self.flush_typing()
        self.lone = None
        if self.press is not None:  # a release was lost: the earlier press still counts as a click
            self.warnings.append(f"a {self.press['button']} press at t={self.press['t']:.2f} s had no release")
            self.release(self.press, self.press)
            self.last_click = None  # with a release lost, a double click can't be told from two clicks
        self.press = e

    def up(self, e: dict[str, Any]) -> None:
        press = self.press
        if press is None or press["button"] != e["button"]:
            return  # a release whose press came before the recording started
        self.press = None
        self.release(press, e)

    def release(self, press: dict[str, Any], e: dict[str, Any]) -> None:
        x0, y0, x1, y1 = press["x"], press["y"], e["x"], e["y"]
        extra = {"modifiers": mods} if (mods := self.modifiers()) else {}
        button = press["button"]
        if button == "left" and (x1 - x0) ** 2 + (y1 - y0) ** 2 > self.s.drag_px**2:
            self.emit(Drag(Point(x0, y0), Point(x1, y1)), press["t"], e["t"], extra=extra)
            self.last_click = None
            return
        if button == "right":
            self.emit(RightSingle(Point(x0, y0)), press["t"], e["t"], extra=extra)
            self.last_click = None
            return
        last = self.last_click
        if (
            button == "left"
            and last is not None
            and press["t"] - last[2] <= self.s.double_click_s
            and (x0 - last[0]) ** 2 + (y0 - last[1]) ** 2 <= self.s.double_click_px**2
            and self.out
            and isinstance(self.out[-1].action, Click)
        ):
            first = self.out[-1]
            first.action, first.end = LeftDouble(first.action.point), e["t"]
            self.last_click = None  # a third press starts a new click
            return
        if button == "middle":
            extra["button"] = "middle"
        self.emit(Click(Point(x0, y0)), press["t"], e["t"], extra=extra)
        self.last_click = (x0, y0, e["t"]) if button == "left" and not extra else None

    def scroll(self, e: dict[str, Any]) -> None:
        self.flush_typing()
        self.lone = None
        direction, notches = _direction(e["dx"], e["dy"])
        x, y, t = e["x"], e["y"], e["t"]
        last = self.out[-1] if self.out else None
        if (
            last is not None
            and isinstance(last.action, Scroll)
            and last.action.direction == direction
            and t - last.end <= self.s.scroll_gap_s
            and (x - last.action.point.x) ** 2 + (y - last.action.point.y) ** 2 <= self.s.scroll_px**2
        ):
            last.amount += notches
            last.end = t
            return
        self.emit(Scroll(direction, Point(x, y)), t, t, amount=notches)
        self.last_click = None

    # --- keyboard -------------------------------------------------------------------------------------------------
    def key_down(self, e: dict[str, Any]) -> None:
        name = key_name(e["key"])
        t = e["t"]
        if name in LEVEL_SHIFTS:
            self.lone = None
            return
        if name in MODIFIERS:
            if name not in self.held:
                self.held.append(name)
            self.lone = name if len(self.held) == 1 else None
            return
        self.lone = None
        self.last_click = None
        chord = self.modifiers(without_shift=True)
        if not chord and (len(name) == 1 or name == "space"):
            self.type(" " if name == "space" else name, t)
            return
        if not chord and name == "backspace" and self.typed:
            self.typed.pop()
            self.keystrokes += 1
            self.typed_end = t
            return
        if not chord and name == "enter" and self.typed:
            self.type("\n", t)
            self.flush_typing()
            return
        self.flush_typing()
        keys = [*self.modifiers(), name.lower()]
        if len(keys) > MAX_HOTKEY_KEYS:
            self.warnings.append(f"hotkey {'+'.join(keys)} at t={t:.2f} s has more than {MAX_HOTKEY_KEYS} keys")
            keys = keys[-MAX_HOTKEY_KEYS:]
        self.emit(Hotkey(tuple(keys)), t, t)

    def type(self, char: str, t: float) -> None:
        if not self.typed:
            self.typed_start = t
        self.typed.append(char)
        self.keystrokes += 1
        self.typed_end = t

    def key_up(self, e: dict[str, Any]) -> None:
        name = key_name(e["key"])
        if name not in MODIFIERS:
            return
        if name in self.held:
            self.held.remove(name)
        if self.lone == name and name in self.s.lone_modifier_keys:
            self.flush_typing()
            self.emit(Hotkey((name,)), e["t"], e["t"])
        self.lone = None

    def finish(self) -> None:
        if self.press is not None:
            self.warnings.append(f"the recording ended with the {self.press['button']} button still pressed")
            self.release(self.press, self.press)
            self.press = None
        self.flush_typing()


def reduce_events(events: list[dict[str, Any]], settings: Settings | None = None) -> Reduction:
    """Reduce ordered events (see annotation_app.insitu.events) to actions with key frames."""
    r = _Reducer(settings or Settings())
    frame_times: list[float] = []
    frame_files: list[str] = []
    down, up, scroll, key_down, key_up = r.down, r.up, r.scroll, r.key_down, r.key_up
    paused = False
    for e in events:
        kind = e["type"]
        if kind == "move":
            continue
        if kind == "screenshot":
            frame_times.append(e["t"])
            frame_files.append(e["file"])
        elif kind == "key_down":
            key_down(e)
        elif kind == "key_up":
            key_up(e)
        elif kind == "down":
            down(e)
        elif kind == "up":
            up(e)
        elif kind == "scroll":
            scroll(e)
        elif kind == "window":
            r.window = e.get("title", "")
        elif kind == "pause" and not paused:
            paused = True
            r.flush_typing()
            r.held.clear()  # keys released while paused were never seen
            r.lone = None
        elif kind == "resume":
            paused = False
    r.finish()
    attach_frames(r.out, frame_times, frame_files)
    return Reduction(r.out, r.warnings, len(events))


def attach_frames(actions: list[ReducedAction], times: list[float], files: list[str]) -> None:
    """Each action's key frame: the last screenshot taken before it and after the previous action ended (so it shows
    that action's result); when there is none in that window, the last one before it, flagged stale."""
    previous_end = float("-inf")
    for reduced in actions:
        i = bisect.bisect_right(times, reduced.start) - 1
        if i >= 0:
            reduced.frame = files[i]
            reduced.frame_stale = times[i] <= previous_end
        previous_end = reduced.end
