"""The UI-TARS output grammar as one regular expression, for decoding constrained to well-formed, in-bounds proposals.

vLLM takes it as `structured_outputs={"regex": …}`; the embedded policy server applies it with a logits processor.
The regex is derived from the grammar's own table (`sandbox.actions.SPECS`): each action is written as
`format_action` writes it, so everything it accepts parses with `sandbox.actions.parse_step` and has its points
inside the model image.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from .actions import DIRECTIONS, MAX_HOTKEY_KEYS, SPECS, Arg, quoted_text, written_args

# Keys a constrained proposal may press: enough for real desktop work, nothing that ends the session (no alt+f4).
HOTKEY_KEYS = (
    "ctrl", "shift", "alt", "enter", "tab", "escape", "backspace", "delete", "space", "home", "end",
    "up", "down", "left", "right", "pageup", "pagedown", "a", "c", "v", "x", "z", "s", "f", "l", "t",
)  # fmt: skip
# The actions a desktop proposal may take (the ones that end an episode on a whim, call_user and fail, are left to
# the annotator; `names=` chooses others).
PROPOSAL_ACTIONS = (
    "click", "left_double", "right_single", "drag", "hotkey", "type", "scroll", "wait", "finished",
)  # fmt: skip
_TEXT = r"[A-Za-z0-9 ,.:;!?()_/-]"


def int_range(lo: int, hi: int) -> str:
    """A regex matching the decimal integers lo..hi (no leading zeros), e.g. int_range(0, 1931)."""
    if lo > hi or lo < 0:
        raise ValueError(f"empty or negative range {lo}..{hi}")
    parts: list[str] = []
    if lo == 0:
        parts.append("0")
        lo = 1
    while lo <= hi:
        # The largest block lo..top that shares a prefix and ends on a run of 9s, capped at hi.
        step = 1
        while lo % (step * 10) == 0 and lo + step * 10 - 1 <= hi:
            step *= 10
        top = lo + step - 1
        if top > hi:
            step = 1
            top = lo
        digits_lo, digits_top = str(lo), str(top)
        pattern = ""
        for a, b in zip(digits_lo, digits_top, strict=True):
            pattern += a if a == b else f"[{a}-{b}]"
        parts.append(pattern)
        lo = top + 1
    return "(?:" + "|".join(parts) + ")"


def _value(arg: Arg, box: str, text_chars: int, text: str = _TEXT) -> str:
    """The pattern of one parameter's quoted value, as `format_action` writes it (box notation)."""
    key = "(?:" + "|".join(HOTKEY_KEYS) + ")"
    match arg.kind:
        case "point":
            return box
        case "text":
            return f"'{text}{{{1 if arg.required else 0},{text_chars}}}'"
        case "keys":
            return f"'{key}(?: {key}){{0,{MAX_HOTKEY_KEYS - 1}}}'"
        case "key":
            return f"'{key}'"
        case "direction":
            return "'(?:" + "|".join(DIRECTIONS) + ")'"
        case "seconds":
            return r"'[1-9]'"
    raise ValueError(f"no pattern for parameter kind {arg.kind!r}")


def action_regex(name: str, width: int, height: int, *, text_chars: int = 30, text: str = _TEXT,
                 first_point: tuple[int, int] | None = None) -> str:  # fmt: skip
    """One action of the table, every point inside a `width`x`height` model image (its first point exactly
    `first_point` when given); text values of `text` characters."""
    if name not in SPECS:
        raise ValueError(f"unknown action {name!r}")
    x, y = int_range(0, width - 1), int_range(0, height - 1)
    box = rf"'<\|box_start\|>\({x},{y}\)<\|box_end\|>'"
    params = []
    for arg in written_args(name):
        point = arg.kind == "point" and first_point is not None
        at = rf"'<\|box_start\|>\({first_point[0]},{first_point[1]}\)<\|box_end\|>'" if point else box  # type: ignore[index]
        first_point = None if point else first_point
        params.append(f"{arg.box_key}={_value(arg, at, text_chars, text)}")
    return rf"{re.escape(name)}\({', '.join(params)}\)"


def proposal_regex(
    width: int,
    height: int,
    *,
    thought_chars: int = 80,
    text_chars: int = 30,
    names: Iterable[str] = PROPOSAL_ACTIONS,
) -> str:
    """`Thought: …\\nAction: <one action>` with every point inside a `width`x`height` model image."""
    actions = [action_regex(name, width, height, text_chars=text_chars) for name in names]
    return rf"Thought: {_TEXT}{{1,{thought_chars}}}\nAction: (?:" + "|".join(actions) + ")"


# Grounded decoding (docs/agent.md): a model whose checkpoint asks for it points only at elements the page's outline
# lists. Its click names the element by its outline line, `Thought: I click <line>.`, and the action goes to that
# line's centre; every other action keeps the grammar with a free one-line thought. Like set-of-marks prompting, the
# choice of element stays the model's; what the constraint removes is copying a centre's digits by hand.
GROUNDED_VERBS = {"click": "click", "left_double": "double-click", "right_single": "right-click", "drag": "drag"}
FREE_ACTIONS = ("type", "hotkey", "scroll", "wait", "finished")
# Anything format_action writes between quotes, escapes included; never a control character (PostgreSQL's text
# refuses NUL, and no action means one).
_ANY_TEXT = r"(?:[^'\\\x00-\x1f\x7f]|\\[\\'nrt])"
_LINE = r"[^\x00-\x1f\x7f]"  # a free thought's characters: one line, printable
_OUTLINE_LINE = re.compile(r"^(?P<line>\S.*) \((?P<x>\d+),(?P<y>\d+)\)$")
# A string an instruction quotes ("Type 'forest' into …"): quotes that open after a space and close before one or
# before punctuation, so an apostrophe ("the page's") opens nothing.
_QUOTED = re.compile(r"(?:^|(?<=[\s(]))'([^'\n]{1,40})'(?=[\s.,;:!?)]|$)")


def outline_points(text: str) -> list[tuple[str, int, int]]:
    """The elements of a rendered outline (sandbox/outline.py `render`): each line as written, and its centre."""
    out = []
    for row in text.splitlines()[1:]:
        found = _OUTLINE_LINE.match(row.strip())
        if found:
            out.append((row.strip(), int(found["x"]), int(found["y"])))
    return out


def _literal(text: str) -> str:
    """`text` as a regex literal; a non-ASCII character may also come as replacement characters, which is how a
    byte-level tokenizer's single bytes read one at a time (training/policy/constrained.py joins decoded tokens)."""
    return "".join(re.escape(c) if c.isascii() else f"(?:{re.escape(c)}|\ufffd{{1,4}})" for c in text)


def instruction_quotes(instruction: str) -> list[str]:
    """The strings an instruction quotes, in order and once each: the text a grounded `type` copies."""
    return list(dict.fromkeys(found.group(1) for found in _QUOTED.finditer(instruction)))


def _typed(quotes: Iterable[str]) -> list[str]:
    """`Thought: I type "<a quoted string>".\\nAction: type(content='<it>')`, each also with the Enter that submits
    it (`\\n` at the end), the thought written as the demonstrations write it (JSON) and the content as
    `format_action` does."""
    forms = []
    for quote in quotes:
        for enter in ("", "\n"):
            thought = _literal(json.dumps(quote + enter, ensure_ascii=False))
            content = _literal(quoted_text(quote + enter))
            forms.append(rf"I type {thought}\.\nAction: type\(content='{content}'\)")
    return forms


def grounded_regex(outline: str, width: int, height: int, *, instruction: str = "", thought_chars: int = 120,
                   text_chars: int = 40) -> str:  # fmt: skip
    """`Thought: I click <an outline line>.\\nAction: click(<its centre>)` for every element the outline lists (and
    the same for double-click, right-click and drag's start); `Thought: I type "<q>".\\nAction: type(content='<q>')`
    for every string `q` the instruction quotes; or a free one-line thought and an action that points at no element
    (type, hotkey, scroll, wait, finished), every point inside the `width`x`height` model image."""
    pointing = []
    for line, x, y in outline_points(outline):
        if not (0 <= x < width and 0 <= y < height):
            continue
        for name, verb in GROUNDED_VERBS.items():
            action = action_regex(name, width, height, text_chars=text_chars, text=_ANY_TEXT, first_point=(x, y))
            pointing.append(rf"I {verb} {_literal(line)}\.\nAction: {action}")
    typed = _typed(instruction_quotes(instruction))
    free = [action_regex(name, width, height, text_chars=text_chars, text=_ANY_TEXT) for name in FREE_ACTIONS]
    verbs = [*GROUNDED_VERBS.values(), *(["type"] if typed else [])]  # a grounded form's opening is only its own
    thought = rf"(?!I (?:{'|'.join(verbs)}) ){_LINE}{{1,{thought_chars}}}"
    anything_else = thought + r"\nAction: (?:" + "|".join(free) + ")"
    return "Thought: (?:" + "|".join([*pointing, *typed, anything_else]) + ")"
