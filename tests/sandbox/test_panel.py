"""The sandbox desktop looks like a desktop: a wallpaper, and a panel whose launchers start the installed apps."""

import io

import pytest
from PIL import Image

from sandbox import panel
from sandbox.actions import Click, Point
from sandbox.desktop import Desktop, available
from sandbox.isolation import create_session_user, delete_session_user, isolation_available

from ..waiting import wait_for

pytestmark = pytest.mark.skipif(not (available() and panel.available()), reason="needs Xvfb, openbox, x11vnc, tint2")


def _pixel(desktop: Desktop, x: int, y: int) -> tuple[int, int, int]:
    return Image.open(io.BytesIO(desktop.screenshot(fmt="png"))).convert("RGB").getpixel((x, y))


def test_a_new_desktop_has_a_wallpaper_and_a_panel_that_is_not_an_application(tmp_path):
    desktop = Desktop.start(tmp_path / "home")
    try:
        assert desktop._panel_mapped() and desktop.windows() == []
        assert _pixel(desktop, 640, 300) == panel.WALLPAPER_RGB
        assert _pixel(desktop, 640, desktop.height - 4) != panel.WALLPAPER_RGB  # the panel along the bottom
    finally:
        desktop.stop()
    bare = Desktop.start(tmp_path / "bare", panel=False)
    try:
        assert not bare._panel_mapped() and _pixel(bare, 640, 300) == (0, 0, 0)
    finally:
        bare.stop()


@pytest.mark.skipif(not isolation_available(), reason="needs root and bubblewrap")
def test_the_panels_launcher_starts_a_terminal_inside_the_session(tmp_path):
    user = create_session_user("sbxpanel", tmp_path / "sessions")
    desktop = Desktop.start(user.home, user=user)
    try:
        desktop.execute(Click(Point(18, desktop.height - panel.PANEL_HEIGHT // 2)))  # the first launcher: xterm
        assert wait_for(lambda: any(cls == "XTerm" for cls, _ in desktop.windows()), timeout=20)
    finally:
        desktop.stop()
        delete_session_user(user)
