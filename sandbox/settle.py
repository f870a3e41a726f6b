"""Wait for a desktop's screen to settle after an action, so the observation shows what the action caused.

Applications redraw asynchronously: a screenshot taken right after the input was injected can miss the text just
typed or the window just mapped, and a stale frame teaches the model wrong. The X DAMAGE extension reports every
drawing on the root window (inferiors included), so we wait until no drawing has happened for `quiet_s`, giving a
late first redraw up to `grace_s` to start, and never more than `cap_s` in all.

The grace is what an action that draws nothing pays, so two things shorten it without missing a drawing: it counts
from the action's injection (not from when the caller starts waiting: a `wait()` has used it up already), and when
nothing but the window manager can react to the action (the pointer over the bare desktop, no window focused,
before and after), a round trip through the window manager replaces it: openbox answers a _NET_REQUEST_FRAME_EXTENTS
after handling every input event injected before it, so what it draws in reply (a root menu) is already damage.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from Xlib import X
from Xlib.display import Display
from Xlib.ext import damage
from Xlib.protocol import event as xevent

QUIET_S = 0.05  # no drawing for this long: the screen has settled
GRACE_S = 0.1  # an action that draws nothing within this long is taken to draw nothing
CAP_S = 2.0  # the longest wait (an animation or a blinking caret never goes quiet for long)


@dataclass(frozen=True)
class Settled:
    """How long the observation waited for the screen, and whether it gave up at the cap."""

    waited_ms: float
    timed_out: bool
    redraws: int  # damage notifications seen while waiting
    ended_by: str = ""  # "quiet", "grace", "window_manager" or "cap": what ended the wait

    def as_dict(self) -> dict[str, float | bool | int]:
        """The fields stored with a step (waited_ms, timed_out, redraws)."""
        return {k: v for k, v in asdict(self).items() if k != "ended_by"}


class DamageWatch:
    """Drawing on one X display's root window, watched through a DAMAGE object on the given connection.

    `arm()` forgets earlier drawing (call it before the action); `wait()` blocks until the screen is quiet. Damage
    events arrive on `x`'s own event queue, which nothing else of the desktop reads."""

    def __init__(self, x: Display) -> None:
        if not x.has_extension(damage.extname):
            raise RuntimeError("the X server has no DAMAGE extension")
        x.damage_query_version()
        self.x = x
        root = x.screen().root
        self.damage = root.damage_create(damage.DamageReportNonEmpty)
        self.event_type = x.extension_event.DamageNotify
        # Never mapped: the window manager sets its _NET_FRAME_EXTENTS when asked, which is our round trip.
        self.probe = root.create_window(-10, -10, 1, 1, 0, 0, window_class=X.InputOnly, event_mask=X.PropertyChangeMask)
        self.request_extents = x.intern_atom("_NET_REQUEST_FRAME_EXTENTS")
        self.frame_extents = x.intern_atom("_NET_FRAME_EXTENTS")
        self.armed_at = time.monotonic()
        self.wm_answered = False
        self.x.sync()

    def arm(self) -> None:
        """Clear the damage so far and drop queued notifications: only drawing from now on counts."""
        self._drain()
        self.x.damage_subtract(self.damage)
        self.x.sync()
        self._drain()
        self.armed_at = time.monotonic()

    def ask_window_manager(self) -> None:
        """Ask the window manager for a reply that it sends only after handling every event injected before."""
        self.wm_answered = False
        request = xevent.ClientMessage(window=self.probe, client_type=self.request_extents, data=(32, [0] * 5))
        self.x.screen().root.send_event(request, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)
        self.x.flush()

    def wait(
        self,
        quiet_s: float = QUIET_S,
        grace_s: float = GRACE_S,
        cap_s: float = CAP_S,
        *,
        since_arm: bool = False,
        wm_only: Callable[[], bool] | None = None,
    ) -> Settled:
        """Block until no drawing for `quiet_s` (or none at all within `grace_s`), at most `cap_s`. With `since_arm`
        the grace counts from the last `arm()` (the action's injection). With `wm_only` (after
        `ask_window_manager()`), nothing drawn by the time the window manager answers, and `wm_only()` still true
        then (nothing but the window manager could react), settles at once."""
        start = time.monotonic()
        grace_from = min(start, self.armed_at) if since_arm else start
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
            settle_at = grace_from + grace_s if last_redraw is None else last_redraw + quiet_s
            if last_redraw is None and wm_only is not None and self.wm_answered:
                if wm_only():
                    return Settled(round((now - start) * 1000, 1), False, redraws, "window_manager")
                wm_only = None  # something else may draw now: the full grace
            if now >= settle_at:
                return Settled(round((now - start) * 1000, 1), False, redraws, "grace" if not redraws else "quiet")
            if now >= deadline:
                return Settled(round((now - start) * 1000, 1), True, redraws, "cap")
            select.select([self.x.fileno()], [], [], max(0.0, min(settle_at, deadline) - now))

    def close(self) -> None:
        try:
            self.probe.destroy()
            self.x.damage_destroy(self.damage)
            self.x.flush()
        except Exception:
            pass

    def _drain(self) -> bool:
        """Consume queued events; True when one of them was a damage notification. Notes the window manager's
        answer (see `ask_window_manager`)."""
        damaged = False
        while self.x.pending_events():
            event = self.x.next_event()
            damaged = damaged or event.type == self.event_type
            if event.type == X.PropertyNotify and event.window.id == self.probe.id and event.atom == self.frame_extents:
                self.wm_answered = True
        return damaged
