"""The global pause/resume hotkey (default ctrl+alt+p), matched on the capture's own key events: no second keyboard
hook, and it works the same on X11 displays and under pynput."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .errors import RecorderError
from .keys import MODIFIERS

DEFAULT_HOTKEY = "ctrl+alt+p"
MODIFIER_ORDER = ["ctrl", "alt", "altgr", "shift", "cmd"]
ALIASES = {"control": "ctrl", "option": "alt", "super": "cmd", "win": "cmd", "meta": "cmd", "command": "cmd"}


@dataclass(frozen=True)
class Hotkey:
    modifiers: frozenset[str]
    key: str  # lower-case key: a character or a key name

    def __str__(self) -> str:
        return "+".join([*sorted(self.modifiers, key=MODIFIER_ORDER.index), self.key])


def parse_hotkey(text: str) -> Hotkey:
    """Parse e.g. "ctrl+alt+p" -> Hotkey({ctrl, alt}, "p"): modifiers, then exactly one other key."""
    parts = [ALIASES.get(p.strip().lower(), p.strip().lower()) for p in text.split("+")]
    modifiers = [p for p in parts if p in MODIFIERS]
    keys = [p for p in parts if p and p not in MODIFIERS]
    if len(keys) != 1 or not modifiers:
        raise RecorderError(f"a hotkey is modifiers and one key, e.g. ctrl+alt+p; not {text!r}")
    return Hotkey(frozenset(modifiers), keys[0])


TOGGLE, REPEAT, NONE = "toggle", "repeat", ""


class HotkeyMatcher:
    """Feed it every key press and release. `press()` answers TOGGLE when the press completes the hotkey (exactly its
    modifiers held, no others), REPEAT when it is the hotkey's key auto-repeating while held down (X11 repeats presses
    without releases), NONE otherwise."""

    def __init__(self, hotkey: Hotkey) -> None:
        self.hotkey = hotkey
        self._held: Counter[str] = Counter()
        self._codes: dict[int, str] = {}  # modifier keycodes down -> their name
        self._down: set[int] = set()  # every keycode down

    def press(self, code: int, key: str | None) -> str:
        repeat = code in self._down
        self._down.add(code)
        if key in MODIFIERS:
            if code not in self._codes:
                self._codes[code] = key
                self._held[key] += 1
            return NONE
        held = {name for name, count in self._held.items() if count > 0}
        if key is None or key.lower() != self.hotkey.key or held != self.hotkey.modifiers:
            return NONE
        return REPEAT if repeat else TOGGLE

    def release(self, code: int) -> None:
        self._down.discard(code)
        if (key := self._codes.pop(code, None)) is not None:
            self._held[key] -= 1
