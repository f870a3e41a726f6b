"""The UI-TARS action grammar: model output -> typed actions -> canonical text, in one place for everyone.

The sandbox executes these actions, the live annotation page validates an annotator's override with them, exports
and the trainer's environments read them. Grammar (bytedance/UI-TARS prompts; see DESIGN.md):

    Thought: …                       (or Reflection: … / Action_Summary: …)
    Action: click(start_box='<|box_start|>(x,y)<|box_end|>')

Several actions in one step are separated by a blank line. Points come as `<|box_start|>(x,y)<|box_end|>`, `(x,y)`,
a box `(x1,y1,x2,y2)` (its centre), `<point>x y</point>` or `<bbox>x1 y1 x2 y2</bbox>`. Errors name what is wrong
and where (line and column of the text given).

What the official UI-TARS converter (`codes/ui_tars/action_parser.py`) accepts is read the same way: `left_single`
is click, `select` is drag, `keydown`/`keyup` are press/release, `hotkey(hotkey=…)` is `hotkey(key=…)`, the mobile
`long_press(…, time='')` and the v1 mobile swipe `scroll(start_box=…, end_box=…)`. `SPECS` is the one table of the
grammar: parsing, formatting, the live page's templates and the constrained-decoding regex
(`sandbox/action_regex.py`) all derive from it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar

DIRECTIONS = ("up", "down", "left", "right")
MAX_HOTKEY_KEYS = 3
# Larger than any screen or model image (relative coordinates stop at 1000): beyond it a number is a model's
# runaway digits, and as a float it would overflow the pixel conversion.
MAX_COORDINATE = 100_000
MAX_LONG_PRESS_S = 60.0


class ActionSyntaxError(ValueError):
    """Text that is not valid UI-TARS output; `line` and `column` (1-based) point at the problem."""

    def __init__(self, message: str, text: str, position: int):
        position = max(0, min(position, len(text)))
        self.message, self.position = message, position
        self.line = text.count("\n", 0, position) + 1
        self.column = position - (text.rfind("\n", 0, position) + 1) + 1
        super().__init__(f"line {self.line}, column {self.column}: {message}")


class Notation(StrEnum):
    BOX = "box"  # start_box='<|box_start|>(x,y)<|box_end|>'  (UI-TARS, UI-TARS-1.5)
    POINT = "point"  # point='<point>x y</point>'  (newer prompts)


@dataclass(frozen=True)
class Point:
    x: float
    y: float


# --- typed actions ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    name: ClassVar[str]


@dataclass(frozen=True)
class Click(Action):
    name: ClassVar[str] = "click"
    point: Point


@dataclass(frozen=True)
class LeftDouble(Action):
    name: ClassVar[str] = "left_double"
    point: Point


@dataclass(frozen=True)
class RightSingle(Action):
    name: ClassVar[str] = "right_single"
    point: Point


@dataclass(frozen=True)
class Hover(Action):
    """Move the pointer without clicking (menus and tooltips that open on hover)."""

    name: ClassVar[str] = "hover"
    point: Point


@dataclass(frozen=True)
class Drag(Action):
    name: ClassVar[str] = "drag"
    start: Point
    end: Point


@dataclass(frozen=True)
class Hotkey(Action):
    """Up to three keys pressed together, lowercase, e.g. ("ctrl", "c")."""

    name: ClassVar[str] = "hotkey"
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Type(Action):
    """Text to type; a trailing newline submits."""

    name: ClassVar[str] = "type"
    content: str


@dataclass(frozen=True)
class Scroll(Action):
    name: ClassVar[str] = "scroll"
    direction: str
    point: Point | None = None


@dataclass(frozen=True)
class Wait(Action):
    name: ClassVar[str] = "wait"


@dataclass(frozen=True)
class Finished(Action):
    name: ClassVar[str] = "finished"
    content: str = ""


@dataclass(frozen=True)
class CallUser(Action):
    """Ask the user for help; ends the episode. Not a FAIL: an infeasible OSWorld task still scores 0 with it."""

    name: ClassVar[str] = "call_user"


@dataclass(frozen=True)
class Fail(Action):
    """Declare the task infeasible (OSWorld's FAIL); ends the episode. Infeasible tasks score 1 only with it."""

    name: ClassVar[str] = "fail"


@dataclass(frozen=True)
class Navigate(Action):
    name: ClassVar[str] = "navigate"
    url: str


@dataclass(frozen=True)
class NavigateBack(Action):
    name: ClassVar[str] = "navigate_back"


@dataclass(frozen=True)
class Press(Action):
    name: ClassVar[str] = "press"
    key: str


@dataclass(frozen=True)
class Release(Action):
    name: ClassVar[str] = "release"
    key: str


@dataclass(frozen=True)
class LongPress(Action):
    """A touch held at `point`, for `seconds` when given (the mobile prompt's `time=''` leaves it to the device)."""

    name: ClassVar[str] = "long_press"
    point: Point
    seconds: float | None = None


@dataclass(frozen=True)
class OpenApp(Action):
    name: ClassVar[str] = "open_app"
    app_name: str


@dataclass(frozen=True)
class PressHome(Action):
    name: ClassVar[str] = "press_home"


@dataclass(frozen=True)
class PressBack(Action):
    name: ClassVar[str] = "press_back"


@dataclass(frozen=True)
class Arg:
    """One parameter of an action: the dataclass attribute, its kind, and its keyword in each notation.

    `written=False` marks a parameter read on input only (the v1 swipe's end_box of scroll): formatting, templates
    and the constrained-decoding regex never write it."""

    attr: str
    kind: str  # point | text | keys | key | direction | seconds
    box_key: str
    point_key: str
    required: bool = True
    aliases: tuple[str, ...] = ()
    written: bool = True

    @property
    def keywords(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.box_key, self.point_key, *self.aliases)))


START = Arg("point", "point", "start_box", "point", aliases=("start_point",))
KEYS = Arg("keys", "keys", "key", "key", aliases=("hotkey",))
KEY = Arg("key", "key", "key", "key")
SPECS: dict[str, tuple[type[Action], tuple[Arg, ...]]] = {
    cls.name: (cls, args)
    for cls, args in [
        (Click, (START,)),
        (LeftDouble, (START,)),
        (RightSingle, (START,)),
        (Hover, (START,)),
        (LongPress, (START, Arg("seconds", "seconds", "time", "time", required=False))),
        (Drag, (Arg("start", "point", "start_box", "start_point"), Arg("end", "point", "end_box", "end_point"))),
        (Hotkey, (KEYS,)),
        (Type, (Arg("content", "text", "content", "content"),)),
        (Scroll, (Arg("point", "point", "start_box", "point", False, ("start_point",)),
                  Arg("direction", "direction", "direction", "direction", required=False),
                  Arg("end", "point", "end_box", "end_point", required=False, written=False))),
        (Wait, ()),
        (Finished, (Arg("content", "text", "content", "content", required=False),)),
        (CallUser, ()),
        (Fail, ()),
        (Navigate, (Arg("url", "text", "content", "content", aliases=("url",)),)),
        (NavigateBack, ()),
        (Press, (KEY,)),
        (Release, (KEY,)),
        (OpenApp, (Arg("app_name", "text", "app_name", "app_name"),)),
        (PressHome, ()),
        (PressBack, ()),
    ]
}  # fmt: skip
# Names the official UI-TARS converter treats as another action (codes/ui_tars/action_parser.py).
ALIASES: dict[str, str] = {"left_single": "click", "select": "drag", "keydown": "press", "keyup": "release"}
# The desktop's action space (what `sandbox.desktop` executes), in the order the live page offers them.
COMPUTER_ACTIONS = (
    "click", "left_double", "right_single", "hover", "drag", "hotkey", "press", "release", "type", "scroll", "wait",
    "finished", "call_user", "fail",
)  # fmt: skip
# Actions that end an episode; which one matters to OSWorld's infeasible tasks (only `fail` is FAIL).
TERMINAL_ACTIONS = ("finished", "call_user", "fail")


def written_args(name: str) -> tuple[Arg, ...]:
    """The parameters a canonical `name(...)` writes, in order (optional durations are left out, like an empty time)."""
    return tuple(a for a in SPECS[name][1] if a.written and not (a.kind == "seconds" and not a.required))


_PLACEHOLDERS = {"point": "<|box_start|>(x,y)<|box_end|>", "text": "", "keys": "ctrl c", "key": "ctrl",
                 "direction": "down", "seconds": "1"}  # fmt: skip


def action_template(name: str) -> str:
    """A snippet to fill in, e.g. "click(start_box='<|box_start|>(x,y)<|box_end|>')" (the live page's editor)."""
    return f"{name}(" + ", ".join(f"{a.box_key}='{_PLACEHOLDERS[a.kind]}'" for a in written_args(name)) + ")"


def action_templates(names: Iterable[str] = COMPUTER_ACTIONS) -> list[str]:
    return [action_template(name) for name in names]


_EXAMPLES: dict[str, Any] = {"point": Point(10, 20), "text": "ok", "keys": ("ctrl", "c"), "key": "shift",
                             "direction": "down", "seconds": None}  # fmt: skip


def example_action(name: str) -> Action:
    """A valid instance of every action type, for tests and docs: each written parameter set, points at (10,20)."""
    cls, _ = SPECS[name]
    values = {a.attr: _EXAMPLES[a.kind] for a in written_args(name)}
    if cls is Drag:
        values["end"] = Point(30, 40)
    return cls(**values)


@dataclass
class ParsedStep:
    """One model turn: its reasoning sections and the actions it takes."""

    thought: str
    actions: list[Action]
    reflection: str = ""
    action_summary: str = ""


# --- parsing ---------------------------------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"\s*")
_LEADING = re.compile(r"[\s\ufeff]*")  # whitespace or a byte-order mark before the text proper
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"  # the exponent only so that any float round-trips
_POINT_PATTERNS = [
    re.compile(rf"<\|box_start\|>\s*[(\[]\s*({_NUMBER})\s*,\s*({_NUMBER})\s*(?:,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*)?[)\]]\s*<\|box_end\|>"),
    re.compile(rf"[(\[]\s*({_NUMBER})\s*,\s*({_NUMBER})\s*(?:,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*)?[)\]]"),
    re.compile(rf"<point>\s*({_NUMBER})[\s,]+({_NUMBER})\s*</point>"),
    re.compile(rf"<bbox>\s*({_NUMBER})[\s,]+({_NUMBER})[\s,]+({_NUMBER})[\s,]+({_NUMBER})\s*</bbox>"),
]  # fmt: skip
_UNESCAPE = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
_SECTION = re.compile(r"^[ \t\ufeff]*(Thought|Reflection|Action_Summary|Action)\s*:", re.MULTILINE)
# Hotkey keys are space-separated; "ctrl+c" (a "+" right after a key name) is read as "ctrl c", and a lone "+"
# between two keys ("ctrl + c") is a separator too, while "+" as the last key ("ctrl +") is the plus key.
_PLUS_AFTER_KEY = re.compile(r"(?<=[^\s+])\+")


def _number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and text.lstrip("-").isdigit() else value


def _coordinate_ok(text: str) -> bool:
    value = float(text)
    return math.isfinite(value) and abs(value) <= MAX_COORDINATE


def parse_point(value: str, text: str = "", position: int = 0) -> Point:
    """A point from any of the accepted notations; a box gives its centre."""
    stripped = value.strip()
    for pattern in _POINT_PATTERNS:
        match = pattern.fullmatch(stripped)
        if match:
            groups = [g for g in match.groups() if g is not None]
            bad = next((g for g in groups if not _coordinate_ok(g)), None)
            if bad is not None:
                shown = bad if len(bad) <= 24 else f"{bad[:12]}…({len(bad)} characters)"
                raise ActionSyntaxError(
                    f"coordinate {shown} is out of range: coordinates are finite numbers within "
                    f"±{MAX_COORDINATE} (pixels of the model image, or 0-1000)",
                    text or value,
                    position,
                )
            numbers = [_number(g) for g in groups]
            if len(numbers) == 4:
                x1, y1, x2, y2 = numbers
                return Point((x1 + x2) / 2, (y1 + y2) / 2)
            return Point(numbers[0], numbers[1])
    raise ActionSyntaxError(
        f"{value!r} is not a point; write '<|box_start|>(x,y)<|box_end|>' or '<point>x y</point>'",
        text or value,
        position,
    )


def _read_string(text: str, i: int) -> tuple[str, int]:
    """A quoted string starting at text[i]; returns its unescaped value and the index after the closing quote."""
    quote = text[i]
    out: list[str] = []
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text):
            nxt = text[j + 1]
            out.append(_UNESCAPE.get(nxt, "\\" + nxt))
            j += 2
            continue
        if ch == quote:
            return "".join(out), j + 1
        out.append(ch)
        j += 1
    raise ActionSyntaxError(f"string opened with {quote} is never closed", text, i)


def _skip_space(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()  # type: ignore[union-attr]


def _read_call(text: str, i: int) -> tuple[Action, int]:
    """One `name(key='value', …)` call starting at text[i]."""
    name_match = _NAME.match(text, i)
    if not name_match:
        raise ActionSyntaxError(f"expected an action name, found {text[i : i + 12]!r}", text, i)
    name = ALIASES.get(name_match.group(), name_match.group())
    if name not in SPECS:
        known = ", ".join(sorted(SPECS))
        raise ActionSyntaxError(f"unknown action {name!r}; known actions: {known}", text, i)
    cls, args = SPECS[name]
    j = _skip_space(text, name_match.end())
    if j >= len(text) or text[j] != "(":
        raise ActionSyntaxError(f"expected '(' after {name}", text, j)
    j = _skip_space(text, j + 1)
    raw: dict[str, tuple[str, int]] = {}
    while j < len(text) and text[j] != ")":
        key_match = _NAME.match(text, j)
        if not key_match:
            raise ActionSyntaxError(f"expected a parameter name or ')' in {name}(…)", text, j)
        key = key_match.group()
        k = _skip_space(text, key_match.end())
        if k >= len(text) or text[k] != "=":
            raise ActionSyntaxError(f"expected '=' after parameter {key!r}", text, k)
        k = _skip_space(text, k + 1)
        if k >= len(text) or text[k] not in "'\"":
            raise ActionSyntaxError(f"the value of {key!r} must be a quoted string", text, k)
        if key in raw:
            raise ActionSyntaxError(f"parameter {key!r} is given twice", text, j)
        value, k = _read_string(text, k)
        raw[key] = (value, j)
        j = _skip_space(text, k)
        if j < len(text) and text[j] == ",":
            j = _skip_space(text, j + 1)
        elif j < len(text) and text[j] != ")":
            raise ActionSyntaxError(f"expected ',' or ')' after the value of {key!r}", text, j)
    if j >= len(text):
        raise ActionSyntaxError(f"{name}(…) is never closed with ')'", text, name_match.start())
    return _build(cls, args, raw, text, name_match.start()), j + 1


def _build(cls: type[Action], args: tuple[Arg, ...], raw: dict[str, tuple[str, int]], text: str, at: int) -> Action:
    values: dict[str, Any] = {}
    used: set[str] = set()
    for arg in args:
        given = [k for k in arg.keywords if k in raw]
        if len(given) > 1:
            raise ActionSyntaxError(f"{', '.join(given)} say the same thing; give one", text, raw[given[1]][1])
        if not given:
            if arg.required:
                raise ActionSyntaxError(f"{cls.name}(…) needs {arg.box_key}=", text, at)
            continue
        used.add(given[0])
        value, position = raw[given[0]]
        values[arg.attr] = _convert(arg, value, text, position)
    unknown = sorted(set(raw) - used)
    if unknown:
        expected = ", ".join(dict.fromkeys(k for a in args for k in (a.box_key, a.point_key) if k)) or "no parameters"
        raise ActionSyntaxError(
            f"{cls.name}(…) has no parameter {unknown[0]!r} (expected {expected})", text, raw[unknown[0]][1]
        )
    if cls in _DERIVED:
        values = _DERIVED[cls](values, lambda message: ActionSyntaxError(message, text, at))
    return cls(**values)


def _scroll_values(values: dict[str, Any], error: Callable[[str], ActionSyntaxError]) -> dict[str, Any]:
    """Scroll by direction, or by the v1 mobile swipe: a finger moving from start_box to end_box.

    As on a touch screen, the content follows the finger, so the view scrolls the other way: a swipe up (the end
    above the start) scrolls down. The longer axis of the swipe decides; the anchor is the start point."""
    end = values.pop("end", None)
    if end is None:
        if "direction" not in values:
            raise error("scroll(…) needs direction= (or start_box= and end_box= of a swipe)")
        return values
    if "direction" in values:
        raise error("scroll(…) takes direction= or end_box=, not both")
    start = values.get("point")
    if start is None:
        raise error("a swipe scroll(…) needs start_box= as well as end_box=")
    dx, dy = end.x - start.x, end.y - start.y
    if dx == 0 and dy == 0:
        raise error("scroll(…) from start_box to the same end_box has no direction")
    if abs(dy) >= abs(dx):
        values["direction"] = "down" if dy < 0 else "up"
    else:
        values["direction"] = "right" if dx < 0 else "left"
    return values


_DERIVED: dict[type[Action], Callable[[dict[str, Any], Callable[[str], ActionSyntaxError]], dict[str, Any]]] = {
    Scroll: _scroll_values,
}


def split_keys(value: str) -> tuple[str, ...]:
    """Hotkey text as lowercase key names: "ctrl c", "Ctrl+C" and "ctrl + c" give ("ctrl", "c"); "ctrl +" keeps +."""
    words = _PLUS_AFTER_KEY.sub(" ", value.lower()).split()
    return tuple(w for n, w in enumerate(words) if not (w == "+" and 0 < n < len(words) - 1))


def _convert(arg: Arg, value: str, text: str, position: int) -> Any:
    if arg.kind == "point":
        return parse_point(value, text, position)
    if arg.kind == "keys":
        keys = split_keys(value)
        if not 1 <= len(keys) <= MAX_HOTKEY_KEYS:
            raise ActionSyntaxError(
                f"a hotkey is 1 to {MAX_HOTKEY_KEYS} space-separated keys, got {value!r}", text, position
            )
        return keys
    if arg.kind == "key":
        if not value.strip() or len(value.split()) != 1:
            raise ActionSyntaxError(f"expected one key name, got {value!r}", text, position)
        return value.strip().lower()
    if arg.kind == "direction":
        if value.strip().lower() not in DIRECTIONS:
            raise ActionSyntaxError(f"direction must be one of {', '.join(DIRECTIONS)}, got {value!r}", text, position)
        return value.strip().lower()
    if arg.kind == "seconds":
        if not value.strip():
            return None  # the mobile prompt's time='': the device's own long press
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not 0 < seconds <= MAX_LONG_PRESS_S:
            raise ActionSyntaxError(
                f"{arg.box_key} is a number of seconds between 0 and {MAX_LONG_PRESS_S:g}, got {value!r}",
                text,
                position,
            )
        return seconds
    return value


def parse_actions(text: str, *, offset: int = 0, source: str | None = None) -> list[Action]:
    """Every action call in `text` (the part after 'Action:'), separated by blank lines or whitespace."""
    full = source if source is not None else text
    actions: list[Action] = []
    i = offset + _LEADING.match(text).end()  # type: ignore[union-attr]
    end = offset + len(text)
    while i < end:
        action, i = _read_call(full[:end], i)
        actions.append(action)
        i = _skip_space(full[:end], i)
    if not actions:
        raise ActionSyntaxError("no action given", full, offset)
    return actions


def parse_step(text: str) -> ParsedStep:
    """A whole model turn: `Thought: … Action: …` (or `Reflection:` / `Action_Summary:` before `Action:`)."""
    headers = list(_SECTION.finditer(text))
    if not headers:
        raise ActionSyntaxError("no 'Action:' section (expected 'Thought: …' then 'Action: …')", text, 0)
    if _LEADING.fullmatch(text, 0, headers[0].start()) is None:
        raise ActionSyntaxError("unexpected text before the first section", text, 0)
    sections: dict[str, tuple[int, int]] = {}
    for n, header in enumerate(headers):
        label = header.group(1)
        if label in sections:
            raise ActionSyntaxError(f"the {label!r} section appears twice", text, header.start())
        if label == "Action" and n != len(headers) - 1:
            raise ActionSyntaxError("'Action:' must be the last section", text, header.start())
        stop = headers[n + 1].start() if n + 1 < len(headers) else len(text)
        sections[label] = (header.end(), stop)
    if "Action" not in sections:
        raise ActionSyntaxError("no 'Action:' section after the reasoning", text, len(text))
    start, stop = sections.pop("Action")
    actions = parse_actions(text[start:stop], offset=start, source=text)

    def section(label: str) -> str:
        return text[slice(*sections[label])].strip() if label in sections else ""

    return ParsedStep(
        thought=section("Thought"),
        actions=actions,
        reflection=section("Reflection"),
        action_summary=section("Action_Summary"),
    )


# --- formatting ------------------------------------------------------------------------------------------------------


def quoted_text(value: str) -> str:
    """A text value as it stands between an action's quotes: backslash, quote, newline, return and tab escaped."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return escaped.replace("\t", "\\t")


def _quote(value: str) -> str:
    return "'" + quoted_text(value) + "'"


def _coordinate(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def format_point(point: Point, notation: Notation = Notation.BOX) -> str:
    x, y = _coordinate(point.x), _coordinate(point.y)
    return f"<|box_start|>({x},{y})<|box_end|>" if notation == Notation.BOX else f"<point>{x} {y}</point>"


def format_action(action: Action, notation: Notation = Notation.BOX) -> str:
    """Canonical text of one action: parse_actions(format_action(a)) == [a]."""
    _, args = SPECS[action.name]
    parts = []
    for arg in args:
        value = getattr(action, arg.attr) if arg.written else None
        if value is None or (not arg.required and value == ""):
            continue
        key = arg.box_key if notation == Notation.BOX else arg.point_key
        if arg.kind == "point":
            text = format_point(value, notation)
        elif arg.kind == "keys":
            text = " ".join(value)
        elif arg.kind == "seconds":
            text = _coordinate(value)
        else:
            text = value
        parts.append(f"{key}={_quote(text)}")
    return f"{action.name}({', '.join(parts)})"


def format_actions(actions: list[Action], notation: Notation = Notation.BOX) -> str:
    return "\n\n".join(format_action(a, notation) for a in actions)


def format_step(step: ParsedStep, notation: Notation = Notation.BOX) -> str:
    """Canonical model output for a step (Reflection/Action_Summary form when those are set)."""
    head = []
    if step.reflection:
        head.append(f"Reflection: {step.reflection}")
    if step.action_summary:
        head.append(f"Action_Summary: {step.action_summary}")
    if step.thought or not head:
        head.append(f"Thought: {step.thought}")
    return "\n".join(head) + "\nAction: " + format_actions(step.actions, notation)


# --- JSON ------------------------------------------------------------------------------------------------------------


def action_to_dict(action: Action) -> dict[str, Any]:
    """A JSON-ready dict: {"type": name, ...}; points become [x, y]."""
    out: dict[str, Any] = {"type": action.name}
    for f in fields(action):
        value = getattr(action, f.name)
        if isinstance(value, Point):
            value = [value.x, value.y]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def action_from_dict(data: dict[str, Any]) -> Action:
    cls, _ = SPECS[data["type"]]
    values = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in ("point", "start", "end") and value is not None:
            value = Point(*value)
        elif f.name == "keys":
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


# --- screen bounds ---------------------------------------------------------------------------------------------------


def action_points(action: Action) -> list[Point]:
    """The points an action touches (click target, drag ends, scroll anchor), in its own coordinates."""
    return [p for p in (getattr(action, name, None) for name in ("point", "start", "end")) if isinstance(p, Point)]


def out_of_bounds(actions: list[Action], width: int, height: int) -> list[str]:
    """One message per point outside a `width`x`height` image (the model image the coordinates refer to)."""
    problems = []
    for n, action in enumerate(actions, start=1):
        for point in action_points(action):
            if not (0 <= point.x < width and 0 <= point.y < height):
                where = f"action {n} ({action.name})" if len(actions) > 1 else action.name
                problems.append(
                    f"{where}: point ({_coordinate(point.x)},{_coordinate(point.y)}) is outside the "
                    f"{width}x{height} screenshot (x 0-{width - 1}, y 0-{height - 1})"
                )
    return problems
