"""The capture's input-event log (docs/in-situ.md, format 1): parse, check and order it, and say what was wrong.

Ordering is by the monotonic clock `t`; the wall clock is kept beside it only to report jumps (NTP, suspend), which
never reorder anything. A bad line is an error naming its line; events merely out of order are sorted and reported.
"""

from __future__ import annotations

import itertools
import json
import operator
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

BUTTONS = frozenset({"left", "right", "middle"})
POINTER_TYPES = frozenset({"move", "down", "up", "scroll"})
KEY_TYPES = frozenset({"key_down", "key_up"})
OTHER_TYPES = frozenset({"window", "screenshot", "pause", "resume"})
EVENT_TYPES = POINTER_TYPES | KEY_TYPES | OTHER_TYPES
WALL_JUMP_S = 2.0  # a wall/monotonic offset change this large is reported as a clock jump
_NUMBER = (int, float)  # exact types, as orjson and json make them: bool is not a number here
_INF = float("inf")


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


def _decode(line: bytes | str, where: str) -> Any:
    """The slow path for a line orjson refused: None when it is blank, else what `json.loads` makes of it.

    `json.loads` stays the reference: it also takes what orjson refuses (NaN, Infinity, 1e400, a UTF-8 BOM, lone
    surrogates), so such lines are accepted or reported exactly as before, and its message names the column.
    """
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventLogError(f"{where}: not valid JSON ({exc})") from None


def parse_lines(
    lines: Iterable[bytes | str], *, source: str = "events.jsonl", max_events: int | None = None
) -> EventLog:
    """Parse JSON Lines into an ordered EventLog; blank lines are skipped.

    Pointer moves are most of a log (90 % in a typical session), so a well-formed `move` is accepted by one inline
    test (the same rules as check_event's); anything else, or a move that fails the test, goes through check_event,
    which accepts it or says what is wrong. Decoding is orjson's (about 4x json.loads), with json.loads behind it for
    the lines orjson refuses. One difference remains: an integer beyond 64 bits comes back as a float (json.loads
    keeps it exact), which every numeric field takes alike, so it changes no verdict.
    """
    events: list[dict[str, Any]] = []
    append = events.append
    loads = orjson.loads
    limit = sys.maxsize if max_events is None else max_events
    for number, line in enumerate(lines, 1):
        try:
            event = loads(line)
        except orjson.JSONDecodeError:
            event = _decode(line, f"{source}:{number}")
            if event is None:
                continue
        if not (
            type(event) is dict
            and event.get("type") == "move"
            and type(t := event.get("t")) in _NUMBER
            and 0 <= t < _INF  # also false for NaN
            and type(event.get("x")) in _NUMBER
            and type(event.get("y")) in _NUMBER
            and type(event.get("wall", 0)) in _NUMBER
        ):
            check_event(event, f"{source}:{number}")
        append(event)
        if len(events) > limit:
            raise EventLogError(f"{source}: more than {max_events:,} events; split the session or raise the limit")
    return order(events)


def order(events: list[dict[str, Any]]) -> EventLog:
    """Sort by the monotonic clock (stable, so equal times keep their recorded order) and report clock trouble."""
    warnings = []
    times = [event["t"] for event in events]
    backwards = sum(map(operator.gt, times, times[1:]))  # pairs where the later event has the earlier time
    if backwards:
        events = sorted(events, key=operator.itemgetter("t"))
        warnings.append(f"{backwards} event(s) were out of order and have been sorted by the monotonic clock")
    walled = [event for event in events if "wall" in event]
    offsets = [event["wall"] - event["t"] for event in walled]
    changes = list(map(operator.sub, offsets[1:], offsets))  # changes[i] is at walled[i + 1]
    jumps = [
        f"{changes[i]:+.1f} s at t={walled[i + 1]['t']:.2f} s"
        for i in itertools.compress(range(len(changes)), map(WALL_JUMP_S.__lt__, map(abs, changes)))
    ]
    if jumps:
        shown = ", ".join(jumps[:3]) + (f" and {len(jumps) - 3} more" if len(jumps) > 3 else "")
        warnings.append(f"the wall clock jumped ({shown}); events are ordered by the monotonic clock")
    return EventLog(events, warnings)
