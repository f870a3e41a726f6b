"""An accessibility-style outline of a browser page: the visible interactive elements (role, label or text, value,
state, centre point), read by JavaScript in the page and written as short text lines for a model's prompt.

It is a general observation feature of browser sessions, like the accessibility trees that web agents read: it knows
nothing of any task, and carries no answer (no "target" marks). Points are converted to the model's image frame, the
frame its actions use, so a model can act on an element by reading its line."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MAX_ELEMENTS = 60  # lines per outline: enough for the largest visible screen, short enough for a small model
MAX_TEXT = 40  # characters of an element's label or value

# Interactive elements in the viewport, in document order. A <label> wrapping a checkbox or radio is one element
# (its box, the control's role and state); elements nested in another interactive element are skipped.
OUTLINE_JS = r"""(() => {
  const ROLES = new Set(['button','link','checkbox','radio','tab','menuitem','option','slider','textbox','combobox',
    'listitem','switch','treeitem','gridcell']);
  const clean = t => (t || '').replace(/\s+/g, ' ').trim().slice(0, 80);
  const control = el => el.tagName === 'LABEL' ? el.querySelector('input[type=checkbox],input[type=radio]') : null;
  const interactive = el => {
    const tag = el.tagName, role = el.getAttribute('role');
    if (['BUTTON','A','SELECT','TEXTAREA','SUMMARY'].includes(tag)) return true;
    if (tag === 'INPUT') return el.type !== 'hidden';
    if (tag === 'LABEL' && control(el)) return true;
    if (role && ROLES.has(role)) return true;
    if (el.onclick || el.ondblclick || el.onmousedown || el.hasAttribute('tabindex')) return true;
    return getComputedStyle(el).cursor === 'pointer' && !(el.parentElement &&
      getComputedStyle(el.parentElement).cursor === 'pointer');
  };
  const labelOf = el => {
    if (el.getAttribute('aria-label')) return el.getAttribute('aria-label');
    if (el.labels && el.labels.length) return el.labels[0].innerText;
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') {
      const before = el.previousElementSibling, parent = el.parentElement;
      const near = before && clean(before.innerText) ? before.innerText :
        (parent && parent !== document.body && clean(parent.innerText).length <= 60 ? parent.innerText : '');
      return el.placeholder || clean(near) || el.title || el.name || '';
    }
    return el.innerText || el.title || el.alt || '';
  };
  const roleOf = el => {
    const box = control(el);
    if (box) return box.type;
    if (el.getAttribute('role')) return el.getAttribute('role');
    const tag = el.tagName;
    if (tag === 'INPUT') return ['checkbox','radio','range'].includes(el.type) ? (el.type === 'range' ? 'slider' :
      el.type) : (['button','submit','reset'].includes(el.type) ? 'button' : 'textbox');
    return {BUTTON:'button', A:'link', SELECT:'combobox', TEXTAREA:'textbox', SUMMARY:'button'}[tag] || 'item';
  };
  const out = [], taken = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (!interactive(el) || taken.some(t => t.contains(el))) continue;
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden' || r.width <= 0 || r.height <= 0) continue;
    if (r.right <= 0 || r.bottom <= 0 || r.left >= innerWidth || r.top >= innerHeight) continue;
    taken.push(el);
    const box = control(el) || el;
    const value = box.tagName === 'SELECT' ? (box.selectedOptions[0] || {}).text :
      (['INPUT','TEXTAREA'].includes(box.tagName) && !['checkbox','radio'].includes(box.type) ? box.value : null);
    out.push({role: roleOf(el), text: clean(labelOf(el)), value: value === null || value === undefined ? null :
      String(value), checked: ['checkbox','radio'].includes(box.type) ? box.checked : null,
      focused: document.activeElement === box, x: r.x, y: r.y, w: r.width, h: r.height});
  }
  return {w: innerWidth, h: innerHeight, elements: out};
})()"""


@dataclass(frozen=True)
class Element:
    """One interactive element as the page showed it: its box in screen (CSS) pixels."""

    role: str
    text: str
    value: str | None
    checked: bool | None
    focused: bool
    x: float
    y: float
    w: float
    h: float

    def centre(self, scale: tuple[float, float] = (1.0, 1.0)) -> tuple[int, int]:
        """The box's centre, scaled into another frame (the model's image)."""
        return round((self.x + self.w / 2) * scale[0]), round((self.y + self.h / 2) * scale[1])


def parse(value: Any) -> list[Element]:
    """The elements of what OUTLINE_JS returned; ValueError for anything else (e.g. a page that overrode it)."""
    if not isinstance(value, dict) or not isinstance(value.get("elements"), list):
        raise ValueError("the outline script returned no element list")
    out = []
    for item in value["elements"][:MAX_ELEMENTS]:
        try:
            out.append(
                Element(
                    role=str(item["role"])[:20],
                    text=_short(str(item.get("text") or "")),
                    value=None if item.get("value") is None else _short(str(item["value"])),
                    checked=None if item.get("checked") is None else bool(item["checked"]),
                    focused=bool(item.get("focused")),
                    x=float(item["x"]),
                    y=float(item["y"]),
                    w=float(item["w"]),
                    h=float(item["h"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a malformed outline element: {item!r:.200}") from exc
    return out


def to_json(elements: list[Element]) -> list[dict[str, Any]]:
    """Elements as stored beside a step (screen pixels); `parse({"elements": rows})` reads them back."""
    return [asdict(e) for e in elements]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def line(element: Element, scale: tuple[float, float] = (1.0, 1.0)) -> str:
    """One element as a prompt line: `checkbox "Apples" checked (412,96)`."""
    parts = [element.role, _quoted(element.text)]
    if element.value is not None:
        parts.append("value=" + _quoted(element.value))
    if element.checked is not None:
        parts.append("checked" if element.checked else "unchecked")
    if element.focused:
        parts.append("focused")
    x, y = element.centre(scale)
    parts.append(f"({x},{y})")
    return " ".join(parts)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(elements: list[Element], scale: tuple[float, float] = (1.0, 1.0)) -> str:
    """The outline as prompt text: one line per element, or a line saying there are none."""
    if not elements:
        return "Interactive elements: none visible."
    return "Interactive elements (role, label, state, centre):\n" + "\n".join(line(e, scale) for e in elements)


def element_at(elements: list[Element], x: float, y: float, scale: tuple[float, float] = (1.0, 1.0)) -> Element | None:
    """The smallest element whose box (scaled into the same frame as x, y) holds the point, if any."""
    inside = [
        e
        for e in elements
        if e.x * scale[0] <= x <= (e.x + e.w) * scale[0] and e.y * scale[1] <= y <= (e.y + e.h) * scale[1]
    ]
    return min(inside, key=lambda e: e.w * e.h, default=None)
