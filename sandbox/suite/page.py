"""Local pages of the suite's browser families: self-contained HTML as data: URLs (sessions have no network), the
probe that reads element boxes and values from a page, and UI-TARS action helpers in screen pixels."""

from __future__ import annotations

import base64
import html
import json
import random
from typing import Any

from ..actions import Click, Drag, Finished, Hotkey, LeftDouble, Point, Scroll, Type, format_action

SCREEN = (1280, 800)  # the browser session's viewport: CSS pixels of the page are screen pixels
STYLE = """
body{margin:0;font:18px/1.3 "DejaVu Sans",sans-serif;background:#f3f3f0;color:#222;overflow-x:hidden}
.abs{position:absolute}
button,.btn{font:inherit;padding:10px 18px;border:2px solid #456;border-radius:6px;background:#fff;cursor:pointer}
input[type=text]{font:inherit;padding:6px 8px;width:260px;border:2px solid #789;border-radius:4px}
.lbl{font-weight:bold;margin-right:8px}
#status{position:fixed;left:0;right:0;bottom:0;height:34px;line-height:34px;padding-left:12px;background:#dde;
font-size:16px}
"""

# What the oracle reads: viewport, scroll, page state (window.__suite) and every [data-key] element's box and value.
PROBE = """(() => {
  const out = {w: innerWidth, h: innerHeight, sx: scrollX, sy: scrollY, st: window.__suite || null, els: {}};
  for (const el of document.querySelectorAll('[data-key]')) {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    out.els[el.dataset.key] = {x: r.x, y: r.y, w: r.width, h: r.height,
      shown: cs.display !== 'none' && cs.visibility !== 'hidden' && r.width > 0 && r.height > 0,
      value: el.value === undefined ? null : el.value, checked: el.checked === undefined ? null : el.checked,
      focus: document.activeElement === el,
      sel: el.selectionStart === undefined ? null : [el.selectionStart, el.selectionEnd]};
  }
  return out;
})()"""


def document(title: str, body: str, script: str) -> str:
    """A whole page: the shared style, `body` and the family's `script` (which fills window.__suite)."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{body}<div id='status'></div>"
        f"<script>window.__suite={{}};const S=window.__suite;"
        f"function status(t){{document.getElementById('status').textContent=t}}\n{script}</script></body></html>"
    )


def data_url(page: str) -> str:
    """The page as a data: URL, so a task's setup (chrome_open_tabs) opens it without files or network."""
    return "data:text/html;charset=utf-8;base64," + base64.b64encode(page.encode()).decode()


def as_js_json(value: Any) -> str:
    """`value` as JavaScript's JSON.stringify writes it (no spaces, characters as they are)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def js(value: Any) -> str:
    """A JSON literal for a page script or verifier."""
    return json.dumps(value)


def esc(text: str) -> str:
    return html.escape(text, quote=True)


def verifier(expression: str, expected: Any) -> dict[str, Any]:
    """An evaluator: the JSON of `expression` (read from the page's own state) equals `expected`'s JSON."""
    script = f"(() => {{ try {{ return JSON.stringify({expression}); }} catch (e) {{ return 'error: ' + e; }} }})()"
    return {
        "func": "exact_match",
        "result": {"type": "js_value", "script": script},
        "expected": {"type": "rule", "rules": {"expected": as_js_json(expected)}},
    }


def place(rng: random.Random, n: int, w: int, h: int, area: tuple[int, int, int, int]) -> list[tuple[int, int]]:
    """`n` non-overlapping top-left corners of w×h boxes in `area` (x, y, width, height): random cells, jittered."""
    x0, y0, aw, ah = area
    cw, ch = w + 24, h + 24
    cells = [(c, r) for c in range(aw // cw) for r in range(ah // ch)]
    if len(cells) < n:
        raise ValueError(f"{n} boxes of {w}x{h} don't fit in {area}")
    chosen = rng.sample(cells, n)
    return [(x0 + c * cw + rng.randint(0, 20), y0 + r * ch + rng.randint(0, 20)) for c, r in chosen]


# --- actions in screen pixels ---------------------------------------------------------------------------------------


def center(box: dict[str, Any]) -> Point:
    return Point(round(box["x"] + box["w"] / 2), round(box["y"] + box["h"] / 2))


def click(box: dict[str, Any]) -> str:
    return format_action(Click(center(box)))


def double_click(box: dict[str, Any]) -> str:
    return format_action(LeftDouble(center(box)))


def drag(start: Point, end: Point) -> str:
    return format_action(Drag(start, end))


def type_text(text: str) -> str:
    return format_action(Type(text))


def hotkey(*keys: str) -> str:
    return format_action(Hotkey(tuple(keys)))


def scroll(direction: str, at: Point | None = None) -> str:
    return format_action(Scroll(direction, at or Point(SCREEN[0] // 2, SCREEN[1] // 2)))


def finished(what: str = "done") -> str:
    return format_action(Finished(what))


def in_view(box: dict[str, Any], state: dict[str, Any], margin: int = 40) -> bool:
    """Whether the element is wholly on screen, clear of the status bar at the bottom."""
    return box["shown"] and box["y"] >= 0 and box["y"] + box["h"] <= state["h"] - margin


def scroll_towards(box: dict[str, Any], state: dict[str, Any]) -> str:
    return scroll("down" if box["y"] > 0 else "up")


def fix_input(box: dict[str, Any], wanted: str) -> str | None:
    """The next action that makes a text field hold `wanted`, or None when it does: focus, select all, type."""
    value = box["value"] or ""
    if value == wanted:
        return None
    if not box["focus"]:
        return click(box)
    if value and box["sel"] != [0, len(value)]:
        return hotkey("ctrl", "a")
    return type_text(wanted) if wanted else hotkey("backspace")
