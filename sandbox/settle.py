"""Wait for a desktop's screen to settle after an action, so the observation shows what the action caused.

Applications redraw asynchronously: a screenshot taken right after the input was injected can miss the text just
typed or the window just mapped, and a stale frame teaches the model wrong. The X DAMAGE extension reports every
drawing on the root window (inferiors included), so we wait until no drawing has happened for `quiet_s`, giving a
late first redraw up to `grace_s` to start, and never more than `cap_s` in all.
"""

from __future__ import annotations

import select
import time
from dataclasses import asdict, dataclass

from Xlib.display import Display
from Xlib.ext import damage

QUIET_S = 0.05  # no drawing for this long: the screen has settled
GRACE_S = 0.1  # an action that draws nothing within this long is taken to draw nothing
CAP_S = 2.0  # the longest wait (an animation or a blinking caret never goes quiet for long)


@dataclass(frozen=True)
class Settled:
    """How long the observation waited for the screen, and whether it gave up at the cap."""

    waited_ms: float
    timed_out: bool
    redraws: int  # damage notifications seen while waiting

    def as_dict(self) -> dict[str, float | bool | int]:
        return asdict(self)


class DamageWatch:
    """Drawing on one X display's root window, watched through a DAMAGE object on the given connection.

    `arm()` forgets earlier drawing (call it before the action); `wait()` blocks until the screen is quiet. Damage
    events arrive on `x`'s own event queue, which nothing else of the desktop reads."""

    def __init__(self, x: Display) -> None:
        if not x.has_extension(damage.extname):
            raise RuntimeError("the X server has no DAMAGE extension")
        x.damage_query_version()
        self.x = x
        self.damage = x.screen().root.damage_create(damage.DamageReportNonEmpty)
        self.event_type = x.extension_event.DamageNotify
        self.x.sync()

    def arm(self) -> None:
        """Clear the damage so far and drop queued notifications: only drawing from now on counts."""
        self._drain()
        self.x.damage_subtract(self.damage)
        self.x.sync()
        self._drain()

    def wait(self, quiet_s: float = QUIET_S, grace_s: float = GRACE_S, cap_s: float = CAP_S) -> Settled:
        """Block until no drawing for `quiet_s` (or none at all within `grace_s`), at most `cap_s`."""
        start = time.monotonic()
        deadline = start + cap_s
        last_redraw: float | None = None
        redraws = 0
        while True:
            if self._drain():
                redraws += 1
                last_redraw = time.monotonic()
                self.x.damage_subtract(self.damage)  # re-arm: the next drawing sends a new notification
                self.x.flush()
            now = time.monotonic()
            settle_at = start + grace_s if last_redraw is None else last_redraw + quiet_s
            if now >= settle_at:
                return Settled(round((now - start) * 1000, 1), False, redraws)
            if now >= deadline:
                return Settled(round((now - start) * 1000, 1), True, redraws)
            select.select([self.x.fileno()], [], [], max(0.0, min(settle_at, deadline) - now))

    def close(self) -> None:
        try:
            self.x.damage_destroy(self.damage)
            self.x.flush()
        except Exception:
            pass

    def _drain(self) -> bool:
        """Consume queued events; True when one of them was a damage notification."""
        damaged = False
        while self.x.pending_events():
            event = self.x.next_event()
            damaged = damaged or event.type == self.event_type
        return damaged
