"""Key and button names of the capture format: a printable character as itself ("a", "A", "1", " ") or a key name
(enter, backspace, tab, esc, ctrl, shift, alt, cmd, up, f5, ...), from X11 keysyms or pynput's keys alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

# X11 keysym names -> the format's key names (left/right variants collapse: the pipeline wants "ctrl", not ctrl_r).
X11_NAMES = {
    "Return": "enter", "KP_Enter": "enter", "BackSpace": "backspace", "Tab": "tab", "ISO_Left_Tab": "tab",
    "Escape": "esc", "Control_L": "ctrl", "Control_R": "ctrl", "Shift_L": "shift", "Shift_R": "shift",
    "Alt_L": "alt", "Alt_R": "alt", "Meta_L": "alt", "Meta_R": "alt", "Super_L": "cmd", "Super_R": "cmd",
    "Hyper_L": "cmd", "Hyper_R": "cmd", "ISO_Level3_Shift": "altgr", "Mode_switch": "altgr",
    "Up": "up", "Down": "down", "Left": "left", "Right": "right", "Prior": "pageup", "Next": "pagedown",
    "Home": "home", "End": "end", "Insert": "insert", "Delete": "delete", "Caps_Lock": "capslock",
    "Num_Lock": "numlock", "Scroll_Lock": "scrolllock", "Print": "printscreen", "Pause": "pause", "Menu": "menu",
    "KP_Up": "up", "KP_Down": "down", "KP_Left": "left", "KP_Right": "right", "KP_Prior": "pageup",
    "KP_Next": "pagedown", "KP_Home": "home", "KP_End": "end", "KP_Insert": "insert", "KP_Delete": "delete",
    "KP_Begin": "clear", "Clear": "clear",
}  # fmt: skip
KEYPAD_CHARS = {
    "KP_Add": "+", "KP_Subtract": "-", "KP_Multiply": "*", "KP_Divide": "/", "KP_Decimal": ".", "KP_Separator": ",",
    "KP_Equal": "=", "KP_Space": " ", **{f"KP_{d}": str(d) for d in range(10)},
}  # fmt: skip

# pynput Key names -> the format's key names (the rest map by dropping _l/_r and underscores: page_up -> pageup).
PYNPUT_NAMES = {
    "ctrl_l": "ctrl", "ctrl_r": "ctrl", "shift_l": "shift", "shift_r": "shift", "shift": "shift", "alt_l": "alt",
    "alt_r": "alt", "alt_gr": "altgr", "cmd_l": "cmd", "cmd_r": "cmd", "esc": "esc", "enter": "enter",
    "space": " ", "print_screen": "printscreen", "caps_lock": "capslock", "num_lock": "numlock",
    "scroll_lock": "scrolllock", "page_up": "pageup", "page_down": "pagedown",
}  # fmt: skip

MODIFIERS = frozenset({"ctrl", "shift", "alt", "cmd", "altgr"})

# X button numbers -> (kind, name or scroll (dx, dy)); dy > 0 is up, dx > 0 is right.
X11_BUTTONS: dict[int, str] = {1: "left", 2: "middle", 3: "right"}
X11_SCROLL: dict[int, tuple[int, int]] = {4: (0, 1), 5: (0, -1), 6: (-1, 0), 7: (1, 0)}


@functools.cache
def _keysym_to_utf32() -> Callable[[int], int] | None:
    """libxkbcommon's keysym -> Unicode table (present wherever a modern X11 or Wayland desktop is), if available."""
    try:
        import ctypes
        import ctypes.util

        library = ctypes.CDLL(ctypes.util.find_library("xkbcommon") or "libxkbcommon.so.0")
        function = library.xkb_keysym_to_utf32
        function.argtypes, function.restype = [ctypes.c_uint32], ctypes.c_uint32
        return function  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


@functools.cache
def _keysym_names() -> dict[int, str]:
    """X11 keysym -> its name (Return, Control_L, F5, KP_Add, ...), preferring the names this module maps."""
    from Xlib import XK

    for group in ("miscellany", "latin1", "xkb", "xf86"):
        try:
            XK.load_keysym_group(group)
        except ImportError:
            pass
    names: dict[int, str] = {}
    for attribute, value in vars(XK).items():
        if attribute.startswith("XK_") and isinstance(value, int):
            name = attribute[3:]
            if value not in names or name in X11_NAMES or name in KEYPAD_CHARS:
                names[value] = name
    return names


def x11_key(keysym: int) -> str | None:
    """The format's key for an X11 keysym (None for NoSymbol)."""
    if keysym == 0:
        return None
    if 0x20 <= keysym <= 0x7E or 0xA0 <= keysym <= 0xFF:
        return chr(keysym)
    if 0x01000100 <= keysym <= 0x0110FFFF:
        char = chr(keysym - 0x01000000)
        return char if char.isprintable() else f"u{keysym - 0x01000000:04x}"
    name = _keysym_names().get(keysym)
    if name in X11_NAMES:
        return X11_NAMES[name]
    if name in KEYPAD_CHARS:
        return KEYPAD_CHARS[name]
    if name and name[0] == "F" and name[1:].isdigit():
        return name.lower()
    if (to_utf32 := _keysym_to_utf32()) is not None and (point := to_utf32(keysym)) and chr(point).isprintable():
        return chr(point)  # a legacy keysym of a non-Latin layout (Cyrillic_a is U+0430)
    return name.lower() if name else f"keysym_{keysym:x}"


def pynput_key(key: Any) -> str | None:
    """The format's key for a pynput Key or KeyCode (macOS and Windows listeners)."""
    name = getattr(key, "name", None)
    if name:  # a pynput.keyboard.Key member
        if name in PYNPUT_NAMES:
            return PYNPUT_NAMES[name]
        return name.replace("_", "") if not name.startswith("media_") else name
    char = getattr(key, "char", None)
    if char:
        if len(char) == 1 and ord(char) < 0x20:  # ctrl+c arrives as "\x03" on Windows: name the letter instead
            return chr(ord(char) + 0x60)
        return char
    vk = getattr(key, "vk", None)
    return f"vk_{vk}" if vk is not None else None
