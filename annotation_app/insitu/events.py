"""The capture's input-event log (docs/in-situ.md, format 1): parse, check and order it, and say what was wrong.

Ordering is by the monotonic clock `t`; the wall clock is kept beside it only to report jumps (NTP, suspend), which
never reorder anything. A bad line is an error naming its line; events merely out of order are sorted and reported.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

BUTTONS = frozenset({"left", "right", "middle"})
POINTER_TYPES = frozenset({"move", "down", "up", "scroll"})
KEY_TYPES = frozenset({"key_down", "key_up"})
OTHER_TYPES = frozenset({"window", "screenshot", "pause", "resume"})
EVENT_TYPES = POINTER_TYPES | KEY_TYPES | OTHER_TYPES
WALL_JUMP_S = 2.0  # a wall/monotonic offset change this large is reported as a clock jump


class EventLogError(ValueError):
    """The event log can't be used; the message names the line and the field."""


@dataclass
class EventLog:
    """Events ordered by `t`, with what was repaired or noticed on the way (shown to the annotator)."""

    events: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.events[-1]["t"] - self.events[0]["t"] if self.events else 0.0


def _number(event: dict[str, Any], key: str, where: str) -> float:
    value = event.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventLogError(f"{where}: `{key}` must be a number, got {value!r}")
    return value


def check_event(event: Any, where: str) -> dict[str, Any]:
    """`event` if it is a well-formed event; EventLogError naming `where` and the field otherwise."""
    if not isinstance(event, dict):
        raise EventLogError(f"{where}: an event must be a JSON object")
    kind = event.get("type")
    if kind not in EVENT_TYPES:
        raise EventLogError(f"{where}: unknown event type {kind!r} (expected one of {', '.join(sorted(EVENT_TYPES))})")
    t = _number(event, "t", where)
    if t < 0 or t != t or t == float("inf"):
        raise EventLogError(f"{where}: `t` must be seconds since the session started, got {t!r}")
    if "wall" in event:
        _number(event, "wall", where)
    if kind in POINTER_TYPES:
        _number(event, "x", where)
        _number(event, "y", where)
        if kind in ("down", "up") and event.get("button") not in BUTTONS:
            raise EventLogError(f"{where}: `button` must be one of left, right, middle, got {event.get('button')!r}")
        if kind == "scroll":
            _number(event, "dx", where)
            _number(event, "dy", where)
    elif kind in KEY_TYPES:
        key = event.get("key")
        if not isinstance(key, str) or not key:
            raise EventLogError(f"{where}: `key` must be a non-empty string, got {key!r}")
    elif kind == "screenshot":
        name = event.get("file")
        if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
            raise EventLogError(f"{where}: `file` must be a relative path inside the capture, got {name!r}")
    elif kind == "window" and not isinstance(event.get("title", ""), str):
        raise EventLogError(f"{where}: `title` must be a string")
    return event


def parse_lines(
    lines: Iterable[bytes | str], *, source: str = "events.jsonl", max_events: int | None = None
) -> EventLog:
    """Parse JSON Lines into an ordered EventLog; blank lines are skipped."""
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EventLogError(f"{where}: not valid JSON ({exc})") from None
        events.append(check_event(event, where))
        if max_events is not None and len(events) > max_events:
            raise EventLogError(f"{source}: more than {max_events:,} events; split the session or raise the limit")
    return order(events)


def order(events: list[dict[str, Any]]) -> EventLog:
    """Sort by the monotonic clock (stable, so equal times keep their recorded order) and report clock trouble."""
    warnings = []
    backwards = sum(1 for a, b in itertools.pairwise(events) if b["t"] < a["t"])
    if backwards:
        events = sorted(events, key=lambda e: e["t"])
        warnings.append(f"{backwards} event(s) were out of order and have been sorted by the monotonic clock")
    jumps = []
    offset = None
    for event in events:
        if "wall" not in event:
            continue
        now = event["wall"] - event["t"]
        if offset is not None and abs(now - offset) > WALL_JUMP_S:
            jumps.append(f"{now - offset:+.1f} s at t={event['t']:.2f} s")
        offset = now
    if jumps:
        shown = ", ".join(jumps[:3]) + (f" and {len(jumps) - 3} more" if len(jumps) > 3 else "")
        warnings.append(f"the wall clock jumped ({shown}); events are ordered by the monotonic clock")
    return EventLog(events, warnings)
