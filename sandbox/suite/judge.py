"""Whether a proposed action does what the oracle's does, so a simulated annotator can accept a model's candidate
instead of overriding it. Actions are compared in screen pixels: a point counts when it falls on the element the
oracle's point is on (the smallest probed box around it), or within a few pixels where no box is known."""

from __future__ import annotations

from typing import Any

from ..actions import (
    Action,
    ActionSyntaxError,
    Click,
    Drag,
    Finished,
    Hotkey,
    LeftDouble,
    Point,
    RightSingle,
    Scroll,
    Type,
    parse_actions,
)

NEAR_PX = 10  # a point with no element under it must be this close (a slider's value changes every 25 px or more)
NEAR_DESKTOP_PX = 60  # desktop tasks: the oracle clicks only to focus a maximized window


def _box_at(point: Point, state: dict[str, Any]) -> dict[str, Any] | None:
    """The smallest shown element box of the probed page that contains `point`."""
    boxes = [
        b
        for b in (state.get("els") or {}).values()
        if b.get("shown") and b["x"] <= point.x <= b["x"] + b["w"] and b["y"] <= point.y <= b["y"] + b["h"]
    ]
    return min(boxes, key=lambda b: b["w"] * b["h"], default=None)


def _same_place(wanted: Point, given: Point, state: dict[str, Any], near: float) -> bool:
    box = _box_at(wanted, state)
    if box is not None:
        return box["x"] <= given.x <= box["x"] + box["w"] and box["y"] <= given.y <= box["y"] + box["h"]
    return abs(wanted.x - given.x) <= near and abs(wanted.y - given.y) <= near


def _same(wanted: Action, given: Action, state: dict[str, Any], near: float) -> bool:
    if type(wanted) is not type(given):
        return False
    match wanted, given:
        case (Click(a), Click(b)) | (LeftDouble(a), LeftDouble(b)) | (RightSingle(a), RightSingle(b)):
            return _same_place(a, b, state, near)
        case Drag(a0, a1), Drag(b0, b1):  # the end has no element of its own (a position on a track): near it
            return _same_place(a0, b0, state, near) and abs(a1.x - b1.x) <= NEAR_PX and abs(a1.y - b1.y) <= 3 * NEAR_PX
        case Type(a), Type(b):
            return a == b
        case Hotkey(a), Hotkey(b):
            return sorted(a) == sorted(b)
        case Scroll(a, _), Scroll(b, _):
            return a == b
        case Finished(), Finished():
            return True
    return wanted == given


def agrees(oracle_text: str, proposed_text: str, state: dict[str, Any]) -> bool:
    """Whether the proposed action text does what the oracle's does in `state` (both in screen pixels); text that
    does not parse never agrees."""
    try:
        wanted, given = parse_actions(oracle_text), parse_actions(proposed_text)
    except ActionSyntaxError:
        return False
    near = NEAR_PX if "els" in state else NEAR_DESKTOP_PX
    return len(wanted) == len(given) and all(_same(w, g, state, near) for w, g in zip(wanted, given, strict=True))
