"""Observations wait for the screen to settle: an app that draws late is seen drawn; a busy one is cut at the cap."""

import time

import pytest

from sandbox.actions import Type
from sandbox.desktop import Desktop, available

from ..waiting import wait_for

pytestmark = pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc (scripts/bootstrap)")


@pytest.fixture
def desktop(tmp_path):
    desktop = Desktop.start(tmp_path / "home", 640, 400)
    yield desktop
    desktop.stop()


def _terminal(desktop: Desktop, script: str) -> None:
    desktop.launch(["xterm", "-geometry", "60x10+0+0", "-e", "sh", "-c", script])
    assert wait_for(lambda: any(cls == "XTerm" for cls, _ in desktop.windows())), "xterm never showed a window"
    desktop.arm_settle()
    desktop.settle(cap_s=5)  # the terminal's first drawing is over


def test_the_observation_shows_what_an_app_draws_after_the_action(desktop):
    """The terminal echoes nothing, and prints a line 0.3 s after Enter: a screenshot taken when the action returns
    is stale; one taken after settle() shows the line."""
    _terminal(desktop, "stty -echo; read line; sleep 0.3; echo DRAWN LATE; sleep 60")
    desktop.execute(Type("go\n"))
    before = desktop.screenshot(fmt="png")
    settled = desktop.settle(grace_s=2.0)
    after = desktop.screenshot(fmt="png")
    assert after != before, "the late line is missing from the settled observation"
    assert not settled.timed_out and settled.redraws >= 1
    assert 250 <= settled.waited_ms < 2000


def test_an_action_that_draws_nothing_costs_only_the_grace_period(desktop):
    _terminal(desktop, "stty -echo; read line; sleep 60")
    desktop.execute(Type("x"))
    started = time.monotonic()
    settled = desktop.settle(grace_s=0.1)
    assert (settled.redraws, settled.timed_out) == (0, False)
    assert time.monotonic() - started < 1.0


def test_a_screen_that_never_goes_quiet_is_cut_off_at_the_cap_and_says_so(desktop):
    _terminal(desktop, "stty -echo; read line; while :; do date +%N; sleep 0.01; done")
    desktop.execute(Type("go\n"))
    started = time.monotonic()
    settled = desktop.settle(cap_s=0.5)
    assert settled.timed_out and settled.redraws > 3
    assert time.monotonic() - started < 1.5
