"""Real desktops (Xvfb + openbox + x11vnc): actions land, Unicode types, nothing is left behind."""

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from PIL import Image

from sandbox.actions import Click, Hotkey, Navigate, Point, Scroll, Type, parse_actions
from sandbox.coordinates import ScreenMapping
from sandbox.desktop import Desktop, DesktopError, UnsupportedAction, available, x_paths
from sandbox.isolation import create_session_user, delete_session_user, isolation_available

from ..waiting import wait_for

pytestmark = pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc (scripts/bootstrap)")


@pytest.fixture
def desktop(tmp_path):
    desktop = Desktop.start(tmp_path / "home")
    yield desktop
    desktop.stop()


def test_screenshot_at_the_model_size_and_vnc_on_a_private_unix_socket(desktop):
    mapping = ScreenMapping(desktop.width, desktop.height)
    image = Image.open(__import__("io").BytesIO(desktop.screenshot(mapping.model_size)))
    assert (image.format, image.size) == ("JPEG", (1288, 812))
    assert wait_for(desktop.vnc_socket.exists)
    with socket.socket(socket.AF_UNIX) as vnc:
        vnc.settimeout(5)
        vnc.connect(str(desktop.vnc_socket))
        assert vnc.recv(12).startswith(b"RFB ")
    listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    assert "x11vnc" not in listening  # no TCP port at all


def test_clicks_land_where_the_model_said(desktop):
    mapping = ScreenMapping(desktop.width, desktop.height)
    for action in parse_actions("click(start_box='(644,406)')\n\nscroll(start_box='(100,50)', direction='down')"):
        desktop.execute(action, mapping)
    assert desktop.pointer() == mapping.to_screen(100, 50)
    desktop.execute(Click(Point(644, 406)), mapping)
    assert desktop.pointer() == (640, 400)


def test_typing_unicode_newlines_and_hotkeys_into_a_terminal(desktop):
    out = desktop.home / "typed.txt"
    desktop.launch(["xterm", "-geometry", "80x10+0+0", "-e", "sh", "-c", f'read line; printf %s "$line" > {out}'])
    assert wait_for(lambda: any(cls == "XTerm" for cls, _ in desktop.windows())), "xterm never showed a window"
    desktop.execute(Click(Point(100, 40)))
    time.sleep(0.3)
    desktop.execute(Type("garbage"))
    desktop.execute(Hotkey(("ctrl", "u")))  # the terminal's line kill: erases what was typed
    desktop.execute(Type("Héllo, wörld ✓ — 42 'quoted' \"too\"\n"))
    assert wait_for(out.exists)
    assert wait_for(lambda: out.read_text(encoding="utf-8") == "Héllo, wörld ✓ — 42 'quoted' \"too\"")


def test_actions_of_other_spaces_are_refused(desktop):
    with pytest.raises(UnsupportedAction, match="navigate is not a desktop action"):
        desktop.execute(Navigate("https://example.org"))
    desktop.execute(Scroll("up"))


def test_a_dead_x_server_is_reported_and_stop_cleans_everything(tmp_path):
    desktop = Desktop.start(tmp_path / "home")
    display = desktop.display
    desktop.processes["xvfb"].kill()
    desktop.processes["xvfb"].wait()
    with pytest.raises(DesktopError, match="is gone"):
        desktop.execute(Click(Point(1, 1)))
    desktop.stop()
    assert not Path(f"/tmp/.X{display}-lock").exists() and not Path(f"/tmp/.X11-unix/X{display}").exists()
    leftover = subprocess.run(["pgrep", "-f", f"(Xvfb|x11vnc).*:{display}( |$)"], capture_output=True, text=True)
    assert leftover.stdout == "", leftover.stdout


def test_stop_leaves_the_x_files_of_a_server_that_took_the_display_over(tmp_path):
    """Two copies on one host: desktop A's X server dies, another server takes display :N (its own lock and socket at
    the same paths), then A is stopped. A must not remove the new server's files, or that desktop loses its X."""
    desktop = Desktop.start(tmp_path / "home", panel=False)
    lock, sock = x_paths(desktop.display)
    desktop.processes["xvfb"].kill()
    desktop.processes["xvfb"].wait()
    assert sock.exists()  # what a SIGKILLed server leaves (with -displayfd, Xvfb writes no lock file here)
    successor = socket.socket(socket.AF_UNIX)
    try:
        lock.unlink(missing_ok=True)
        sock.unlink()
        lock.write_text(f"{os.getpid():>10}\n")  # as Xvfb writes it
        successor.bind(str(sock))
        desktop.stop()
        assert lock.exists() and sock.exists()
    finally:
        successor.close()
        lock.unlink(missing_ok=True)
        sock.unlink(missing_ok=True)


@pytest.mark.skipif(not isolation_available(), reason="needs root, bwrap, setpriv, prlimit, useradd")
def test_a_session_desktop_runs_as_the_session_user(tmp_path):
    user = create_session_user(uuid.uuid4().hex[:12], tmp_path / "sessions")
    desktop = Desktop.start(user.home, user=user)
    try:
        assert _uid_of(desktop.processes["xvfb"].pid) == user.uid
        for program in ("openbox", "x11vnc"):  # inside bubblewrap (see isolation.py), as the session's user
            found = subprocess.run(["pgrep", "-u", str(user.uid), "-x", program], capture_output=True, text=True)
            assert found.stdout.split(), program
        out = user.home / "made-by-xterm.txt"
        desktop.launch(["xterm", "-e", "sh", "-c", f"id -un > {out}"])
        assert wait_for(out.exists)
        assert wait_for(lambda: out.read_text().strip() == user.name)
        assert out.stat().st_uid == user.uid
    finally:
        desktop.stop()
        delete_session_user(user)


def _uid_of(pid: int) -> int:
    """The real uid of `pid` (setpriv drops privileges and then execs in place, so the pid stays the same)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))


@pytest.mark.skipif(not isolation_available(), reason="needs root, bwrap, setpriv, prlimit, useradd")
def test_a_task_can_edit_and_save_a_file_in_the_text_editor(tmp_path):
    user = create_session_user(uuid.uuid4().hex[:12], tmp_path / "sessions")
    desktop = Desktop.start(user.home, user=user)
    try:
        notes = user.home / "notes.txt"
        notes.write_text("")
        os.chown(notes, user.uid, user.gid)
        desktop.launch(["mousepad", str(notes)])
        assert wait_for(lambda: any(cls == "Mousepad" for cls, _ in desktop.windows()), timeout=20)
        time.sleep(0.5)
        desktop.execute(Type("Grocery list: café, thé ✓\n"))
        desktop.execute(Hotkey(("ctrl", "s")))
        assert wait_for(lambda: notes.read_text(encoding="utf-8") == "Grocery list: café, thé ✓\n")
    finally:
        desktop.stop()
        delete_session_user(user)
