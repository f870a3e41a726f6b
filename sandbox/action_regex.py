"""The UI-TARS output grammar as one regular expression, for decoding constrained to well-formed, in-bounds proposals.

vLLM takes it as `structured_outputs={"regex": …}`; the embedded policy server applies it with a logits processor.
Everything it accepts parses with `sandbox.actions.parse_step` and has its points inside the model image.
"""

from __future__ import annotations

# Keys a constrained proposal may press: enough for real desktop work, nothing that ends the session (no alt+f4).
HOTKEY_KEYS = (
    "ctrl", "shift", "alt", "enter", "tab", "escape", "backspace", "delete", "space", "home", "end",
    "up", "down", "left", "right", "pageup", "pagedown", "a", "c", "v", "x", "z", "s", "f", "l", "t",
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


def proposal_regex(width: int, height: int, *, thought_chars: int = 80, text_chars: int = 30) -> str:
    """`Thought: …\\nAction: <one action>` with every point inside a `width`x`height` model image."""
    x, y = int_range(0, width - 1), int_range(0, height - 1)
    box = rf"'<\|box_start\|>\({x},{y}\)<\|box_end\|>'"
    text = f"{_TEXT}{{1,{text_chars}}}"
    key = "(?:" + "|".join(HOTKEY_KEYS) + ")"
    actions = [
        rf"click\(start_box={box}\)",
        rf"left_double\(start_box={box}\)",
        rf"right_single\(start_box={box}\)",
        rf"drag\(start_box={box}, end_box={box}\)",
        rf"hotkey\(key='{key}(?: {key}){{0,2}}'\)",
        rf"type\(content='{text}'\)",
        rf"scroll\(start_box={box}, direction='(?:up|down|left|right)'\)",
        r"wait\(\)",
        rf"finished\(content='{_TEXT}{{0,{text_chars}}}'\)",
    ]
    return rf"Thought: {_TEXT}{{1,{thought_chars}}}\nAction: (?:" + "|".join(actions) + ")"
