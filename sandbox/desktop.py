"""A virtual desktop for one sandbox session: Xvfb + openbox + x11vnc (on a unix socket), actions through XTEST.

Actions go through one X connection held by this process (python-xlib's XTEST), not one xdotool process per
action; screenshots come from mss and are encoded at the size the model is told (see coordinates.ScreenMapping).

Each X server wants a cookie (MIT-MAGIC-COOKIE-1) of its own: it is in `~/.Xauthority` of the session (mode 0600,
owned by the session's user), which its window manager, VNC server and applications read, and in this process's
private authority file (see `ServiceAuthority`), which python-xlib and mss read. Xvfb listens on no TCP port; the
session's confined processes see their own display's filesystem socket and no other, and no abstract socket (they
have a network namespace of their own).
"""

from __future__ import annotations

import atexit
import io
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import mss
from mss.exception import ScreenShotError
from PIL import Image
from Xlib import XK, X
from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError, XError
from Xlib.ext import xtest

from . import panel as look
from .actions import (
    Action,
    CallUser,
    Click,
    Drag,
    Fail,
    Finished,
    Hotkey,
    Hover,
    LeftDouble,
    Press,
    Release,
    RightSingle,
    Scroll,
    Type,
    Wait,
)
from .coordinates import ScreenMapping, pixel_of
from .isolation import SessionUser, x_socket
from .settle import CAP_S, GRACE_S, DamageWatch, Settled

# UI-TARS key names -> X keysym names.
KEY_NAMES = {
    "ctrl": "Control_L", "control": "Control_L", "alt": "Alt_L", "shift": "Shift_L", "cmd": "Super_L",
    "super": "Super_L", "win": "Super_L", "meta": "Super_L", "enter": "Return", "return": "Return", "esc": "Escape",
    "escape": "Escape", "backspace": "BackSpace", "tab": "Tab", "space": "space", "delete": "Delete", "del": "Delete",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right", "pageup": "Prior", "pagedown": "Next",
    "home": "Home", "end": "End", "insert": "Insert", "capslock": "Caps_Lock", "arrowup": "Up", "arrowdown": "Down",
    "arrowleft": "Left", "arrowright": "Right",
}  # fmt: skip
SCROLL_BUTTONS = {"up": 4, "down": 5, "left": 6, "right": 7}
SCROLL_CLICKS = 5
COOKIE_NAME = b"MIT-MAGIC-COOKIE-1"
FAMILY_LOCAL, FAMILY_WILD = 256, 65535  # Xauthority address families: this host's unix sockets; any address


class DesktopError(RuntimeError):
    """The desktop could not start, or died under us."""


class UnsupportedAction(ValueError):
    """The action belongs to another action space (browser or mobile)."""


@dataclass
class Desktop:
    """A running desktop. Start one with `Desktop.start()`; `stop()` leaves no process, lock or socket behind."""

    display: int
    width: int
    height: int
    vnc_socket: Path  # VNC only on this unix socket in the session's 0700 home: no TCP port anyone could reach
    home: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    user: SessionUser | None = None
    wait_s: float = 1.0
    # The X server's lock file and socket as it made them (`file_identity`): `stop` removes only those, because
    # once the server is dead another desktop (this service's or another copy's) may own the display number.
    x_files: dict[Path, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        home: Path,
        width: int = 1280,
        height: int = 800,
        *,
        user: SessionUser | None = None,
        timeout: float = 10.0,
        panel: bool = True,
    ) -> Desktop:
        """Start a desktop; with `user`, its X server, window manager and VNC server run as that user, and the
        applications it launches are confined like the user's shell commands (see isolation.py). With `panel` (and
        tint2 installed) it has a wallpaper and a panel with launchers and a clock (see panel.py)."""
        home = user.home if user else home
        home.mkdir(parents=True, exist_ok=True)
        # The X server's cookie, readable by the session's user alone (the server runs as that user and reads it).
        cookie, xauthority = secrets.token_bytes(16), home / ".Xauthority"
        _write_xauthority(xauthority, {None: cookie}, owner=user)
        # Handed over open: the server's user may not be able to walk the path to the home (the cookie's mode
        # still applies), and an X server that can't read its -auth file would let everyone in.
        auth_fd = os.open(xauthority, os.O_RDONLY)
        read_fd, write_fd = os.pipe()
        # The abstract socket stays: -displayfd picks a display whose sockets it can bind, and only the abstract
        # one is refused while another server holds that number (the filesystem one is unlinked and taken over).
        # Sessions can't reach it from their own network namespace, and without the cookie it lets nobody in.
        xvfb = subprocess.Popen(
            [*_run_as(user), "Xvfb", "-displayfd", str(write_fd), "-screen", "0", f"{width}x{height}x24",
             "-auth", f"/proc/self/fd/{auth_fd}", "-nolisten", "tcp", "+extension", "XTEST", "-noreset"],
            pass_fds=(write_fd, auth_fd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        os.close(write_fd)
        os.close(auth_fd)
        display = _read_display(read_fd, xvfb, timeout)
        try:
            open_to_all = not _refuses_strangers(display)
        except OSError as exc:
            _stop_group(xvfb)
            raise DesktopError(f"the X server of :{display} does not answer on its socket ({exc})") from exc
        if open_to_all:
            _stop_group(xvfb)
            raise DesktopError(f"the X server of :{display} let a client in without its cookie")
        _write_xauthority(xauthority, {display: cookie}, owner=user)  # now with the display clients look it up by
        SERVICE_AUTHORITY.add(display, cookie)
        user = user.with_display(display, xauthority) if user else None
        x_files = {path: found for path in x_paths(display) if (found := file_identity(path)) is not None}
        desktop = cls(display, width, height, home / ".vnc.sock", home, {"xvfb": xvfb}, user=user, x_files=x_files)
        desktop.vnc_socket.unlink(missing_ok=True)
        try:
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
            # Confined like the session's own commands: openbox's menus start programs, and x11vnc must not be a
            # way out either.
            desktop.processes["wm"] = desktop._popen(["openbox", "--sm-disable"], **quiet)
            vnc = ["x11vnc", "-display", f":{display}", "-unixsock", str(desktop.vnc_socket), "-rfbport", "0"]
            vnc += ["-rfbportv6", "-1", "-noipv6", "-forever", "-shared", "-nopw", "-quiet", "-noxdamage"]
            # No remote control through X properties the session's applications could set; no MIT-SHM, which needs
            # the X server's IPC namespace.
            vnc += ["-noremote", "-noshm"]
            desktop.processes["vnc"] = desktop._popen(vnc, **quiet)
            desktop._connect()
            desktop._wait_for_window_manager(timeout)
            if panel and look.available():
                desktop._start_panel(timeout)
        except BaseException:
            desktop.stop()
            raise
        return desktop

    @property
    def xauthority(self) -> Path:
        """The file holding this display's cookie (the session's user alone may read it)."""
        return self.home / ".Xauthority"

    def _start_panel(self, timeout: float) -> None:
        """Paint the wallpaper (in-process) and start the panel, waiting until it is on screen: the first
        observation shows it, and a task's launched app is not mistaken for it."""
        root = self.x.screen().root
        r, g, b = look.WALLPAPER_RGB
        root.change_attributes(background_pixel=(r << 16) | (g << 8) | b)
        root.clear_area()
        config = look.write_config(self.home, self.user)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
        self.processes["panel"] = self._popen(["tint2", "-c", str(config)], **quiet)
        deadline = time.monotonic() + timeout
        while not self._panel_mapped():
            if self.processes["panel"].poll() is not None:
                raise DesktopError(f"the panel (tint2) exited with status {self.processes['panel'].returncode}")
            if time.monotonic() > deadline:
                raise DesktopError(f"the panel (tint2) did not show within {timeout} s")
            time.sleep(0.01)

    def _panel_mapped(self) -> bool:
        return any(cls in look.PANEL_CLASSES for cls, _ in self._classed_windows())

    def env(self) -> dict[str, str]:
        """The environment of a program shown on this desktop."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DISPLAY": f":{self.display}", "HOME": str(self.home),
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "XAUTHORITY": str(self.xauthority),
        }  # fmt: skip

    def _popen(self, command: list[str], **kwargs: object) -> subprocess.Popen:
        """Start a program on this desktop: confined as the session's user when there is one (see isolation.py)."""
        argv = self.user.confine(command, env=self.env()) if self.user else command
        return subprocess.Popen(argv, env=self.env(), cwd=self.home, **kwargs)  # type: ignore[call-overload]

    def _connect(self) -> None:
        self.x = xdisplay.Display(f":{self.display}")
        if not self.x.has_extension("XTEST"):
            raise DesktopError("the X server has no XTEST extension")
        self.grabber = mss.MSS(display=f":{self.display}")
        self.watch = DamageWatch(self.x)  # observations wait for the drawing an action causes (settle.py)
        first, count = (
            self.x.display.info.min_keycode,
            self.x.display.info.max_keycode - self.x.display.info.min_keycode,
        )
        mapping = self.x.get_keyboard_mapping(first, count + 1)
        # Keycodes with no symbols, remapped on demand to type characters the keymap lacks (e.g. "✓"). Each such
        # character keeps its own keycode while it can: clients read a remapped key with the mapping current when
        # they process it, so reusing one keycode for the next character too soon would type that one twice.
        self.spare_keycodes = [first + i for i, syms in enumerate(mapping) if not any(syms)]
        if not self.spare_keycodes:
            raise DesktopError("the keymap has no free keycode for typing arbitrary characters")
        self.remapped: dict[int, int] = {}  # keysym -> spare keycode, least recently used first

    def _wait_for_window_manager(self, timeout: float) -> None:
        """Block until openbox manages the screen: a window mapped before that may never be shown."""
        check = self.x.intern_atom("_NET_SUPPORTING_WM_CHECK")
        root = self.x.screen().root
        deadline = time.monotonic() + timeout
        while root.get_full_property(check, X.AnyPropertyType) is None:
            if self.processes["wm"].poll() is not None:
                raise DesktopError(f"the window manager exited with status {self.processes['wm'].returncode}")
            if time.monotonic() > deadline:
                raise DesktopError(f"the window manager did not start within {timeout} s")
            time.sleep(0.01)

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def launch(self, command: list[str]) -> subprocess.Popen:
        """Start an application on this desktop (its process group is stopped with the desktop)."""
        proc = self._popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.processes[f"app{len(self.processes)}"] = proc
        return proc

    def is_alive(self) -> bool:
        core = [self.processes.get(name) for name in ("xvfb", "wm", "vnc")]
        return all(proc is not None and proc.poll() is None for proc in core)

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            _stop_group(proc)
        self.processes.clear()
        SERVICE_AUTHORITY.remove(self.display)
        for path, made in self.x_files.items():  # what a SIGKILLed server leaves; not a successor's
            if file_identity(path) == made:
                path.unlink(missing_ok=True)
        for path in (self.vnc_socket, self.xauthority):  # in the session's own home
            path.unlink(missing_ok=True)
        for handle in ("watch", "grabber", "x"):
            obj = self.__dict__.pop(handle, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    pass

    # --- observation ----------------------------------------------------------------------------------------------

    def screenshot(self, size: tuple[int, int] | None = None, fmt: str = "jpeg", quality: int = 80) -> bytes:
        """The screen as JPEG or PNG, resized to `size` (width, height) when given (the model's image size)."""
        self._check_alive()
        try:
            shot = self.grabber.grab({"left": 0, "top": 0, "width": self.width, "height": self.height})
        except (ScreenShotError, OSError) as exc:
            raise DesktopError(f"desktop :{self.display} is gone ({type(exc).__name__})") from exc
        image = Image.frombuffer("RGB", shot.size, shot.bgra, "raw", "BGRX", 0, 1)
        if size and size != shot.size:
            image = image.resize(size, Image.Resampling.BILINEAR)
        out = io.BytesIO()
        if fmt == "png":
            image.save(out, "PNG", compress_level=1)
        else:
            image.save(out, "JPEG", quality=quality)
        return out.getvalue()

    def arm_settle(self) -> None:
        """Forget the drawing so far: the next `settle()` waits for what happens from now on (e.g. task setup)."""
        self._check_alive()
        self.watch.arm()

    def settle(self, cap_s: float = CAP_S, grace_s: float = GRACE_S, *, since_action: bool = False) -> Settled:
        """Wait until the drawing since the last action has stopped, so the next screenshot shows its effect. With
        `since_action`, the grace for a first redraw counts from the last action's injection, and actions that only
        the window manager could see (the pointer over the bare desktop and no window focused, before and after)
        wait for its answer instead of the grace (settle.py)."""
        self._check_alive()
        wm_only = since_action and self.__dict__.pop("_untargeted_actions", False)
        try:
            if wm_only and self.untargeted():
                self.watch.ask_window_manager()
                return self.watch.wait(grace_s=grace_s, cap_s=cap_s, since_arm=True, wm_only=self.untargeted)
            return self.watch.wait(grace_s=grace_s, cap_s=cap_s, since_arm=since_action)
        except (XError, ConnectionClosedError, OSError) as exc:
            raise DesktopError(f"desktop :{self.display} is gone ({type(exc).__name__})") from exc

    def untargeted(self) -> bool:
        """Whether input now reaches no application: the pointer is over the bare desktop (no top-level window
        under it, the panel included) and the keyboard focus is on no window or on the window manager's own."""
        root = self.x.screen().root
        if root.query_pointer().child:
            return False
        focus = self.x.get_input_focus().focus
        focus_id = focus if isinstance(focus, int) else focus.id
        return focus_id in (X.NONE, X.PointerRoot, root.id, self._wm_window())

    def _wm_window(self) -> int:
        """The window manager's own window (_NET_SUPPORTING_WM_CHECK), where openbox keeps the focus when no
        application has it."""
        if "_wm_check" not in self.__dict__:
            check = self.x.intern_atom("_NET_SUPPORTING_WM_CHECK")
            value = self.x.screen().root.get_full_property(check, X.AnyPropertyType)
            self._wm_check = int(value.value[0]) if value is not None and len(value.value) else -1
        return self._wm_check

    def windows(self) -> list[tuple[str, str]]:
        """(WM class, title) of every top-level application window that is on screen, e.g. ("XTerm", "xterm");
        the desktop's own panel is not one."""
        return [(cls, title) for cls, title in self._classed_windows() if cls not in look.PANEL_CLASSES]

    def _classed_windows(self) -> list[tuple[str, str]]:
        """(WM class, title) of every viewable top-level client window, looking inside window-manager frames."""
        found = []
        pending = list(self.x.screen().root.query_tree().children)
        while pending:
            window = pending.pop()
            try:
                if window.get_attributes().map_state != X.IsViewable:
                    continue
                wm_class = window.get_wm_class()
                if wm_class:
                    found.append((wm_class[1], window.get_wm_name() or ""))
                else:
                    pending.extend(window.query_tree().children)  # a window manager frame: look inside
            except Exception:
                continue
        return found

    def pointer(self) -> tuple[int, int]:
        reply = self.x.screen().root.query_pointer()
        return reply.root_x, reply.root_y

    # --- actions --------------------------------------------------------------------------------------------------

    def execute(self, action: Action, mapping: ScreenMapping | None = None) -> str:
        """Run one action; model coordinates go through `mapping` (default: screen pixels). Returns a status."""
        self._check_alive()
        try:
            # Every action of a step must reach no application for the settle wait to skip its grace (settle.py).
            self._untargeted_actions = self.__dict__.get("_untargeted_actions", True) and self.untargeted()
            self.watch.arm()
            return self._execute(action, mapping)
        except (XError, ConnectionClosedError, OSError) as exc:
            raise DesktopError(f"desktop :{self.display} is gone ({type(exc).__name__})") from exc

    def _execute(self, action: Action, mapping: ScreenMapping | None) -> str:
        at = pixel_of(mapping)
        match action:
            case Click(point):
                self._click(*at(point), button=1)
            case LeftDouble(point):
                self._click(*at(point), button=1, times=2)
            case RightSingle(point):
                self._click(*at(point), button=3)
            case Drag(start, end):
                self._drag(at(start), at(end))
            case Hotkey(keys):
                self._hotkey(keys)
            case Press(key):
                self._key(key, press=True)
            case Release(key):
                self._key(key, press=False)
            case Type(content):
                self.type_text(content)
            case Scroll(direction, point):
                if point is not None:
                    self._move(*at(point))
                self._click(None, None, button=SCROLL_BUTTONS[direction], times=SCROLL_CLICKS)
            case Wait():
                time.sleep(self.wait_s)
            case Hover(point):
                self._move(*at(point))
            case Finished() | CallUser() | Fail():
                return action.name
            case _:
                raise UnsupportedAction(f"{action.name} is not a desktop action")
        self.x.sync()
        return "ok"

    def _check_alive(self) -> None:
        if not self.is_alive():
            raise DesktopError(f"desktop :{self.display} is gone (a process of it exited)")

    def _move(self, x: int, y: int) -> None:
        xtest.fake_input(self.x, X.MotionNotify, x=x, y=y)

    def _click(self, x: int | None, y: int | None, *, button: int, times: int = 1) -> None:
        if x is not None and y is not None:
            self._move(x, y)
        for _ in range(times):
            xtest.fake_input(self.x, X.ButtonPress, button)
            xtest.fake_input(self.x, X.ButtonRelease, button)

    def _drag(self, start: tuple[int, int], end: tuple[int, int], steps: int = 10) -> None:
        self._move(*start)
        xtest.fake_input(self.x, X.ButtonPress, 1)
        for i in range(1, steps + 1):
            self._move(start[0] + (end[0] - start[0]) * i // steps, start[1] + (end[1] - start[1]) * i // steps)
            self.x.sync()
        xtest.fake_input(self.x, X.ButtonRelease, 1)

    def _keycode(self, name: str) -> int:
        keysym = XK.string_to_keysym(KEY_NAMES.get(name, name))
        if keysym == 0 and len(name) == 1:
            keysym = _char_keysym(name)
        keycode = self.x.keysym_to_keycode(keysym)
        if keycode == 0:
            raise ValueError(f"unknown key {name!r}")
        return keycode

    def _key(self, name: str, *, press: bool) -> None:
        xtest.fake_input(self.x, X.KeyPress if press else X.KeyRelease, self._keycode(name))

    def _hotkey(self, keys: tuple[str, ...]) -> None:
        codes = [self._keycode(k) for k in keys]
        for code in codes:
            xtest.fake_input(self.x, X.KeyPress, code)
        for code in reversed(codes):
            xtest.fake_input(self.x, X.KeyRelease, code)

    def type_text(self, text: str) -> None:
        """Type any Unicode text; newlines press Return. Characters missing from the keymap use a spare keycode."""
        shift = self.x.keysym_to_keycode(XK.string_to_keysym("Shift_L"))
        for ch in text:
            keysym = (
                XK.string_to_keysym("Return")
                if ch == "\n"
                else XK.string_to_keysym("Tab")
                if ch == "\t"
                else _char_keysym(ch)
            )
            code, level = self._lookup(keysym)
            if code is None:
                code, level = self._remap(keysym), 0
            if level == 1:
                xtest.fake_input(self.x, X.KeyPress, shift)
            xtest.fake_input(self.x, X.KeyPress, code)
            xtest.fake_input(self.x, X.KeyRelease, code)
            if level == 1:
                xtest.fake_input(self.x, X.KeyRelease, shift)
            self.x.sync()

    def _lookup(self, keysym: int) -> tuple[int | None, int]:
        """A keycode of the standing keymap (and its shift level) that types `keysym`, if any."""
        for code, index in self.x.keysym_to_keycodes(keysym):
            if code not in self.spare_keycodes and index in (0, 1):
                return code, index
        return None, 0

    def _remap(self, keysym: int) -> int:
        """A spare keycode typing `keysym`: its own while it lasts, else the least recently used one."""
        if keysym in self.remapped:
            self.remapped[keysym] = self.remapped.pop(keysym)  # most recently used now
            return self.remapped[keysym]
        in_use = set(self.remapped.values())
        free = [code for code in self.spare_keycodes if code not in in_use]
        if free:
            code = free[0]
        else:
            oldest = next(iter(self.remapped))
            code = self.remapped.pop(oldest)
            time.sleep(0.05)  # let clients read the key presses made with its previous symbol first
        self.x.change_keyboard_mapping(code, [(keysym, keysym)])
        self.x.sync()
        self.remapped[keysym] = code
        return code


def x_paths(display: int) -> tuple[Path, Path]:
    """The lock file and filesystem socket of X display `display`."""
    return Path(f"/tmp/.X{display}-lock"), x_socket(display)


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, mtime in ns) of `path`, or None when it does not exist: tells a file from a later one at the
    same path, even when the filesystem reuses the inode number."""
    try:
        found = path.lstat()
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_mtime_ns


def _refuses_strangers(display: int) -> bool:
    """Whether the X server on `display` turns away a client that brings no cookie (X11 connection setup, no
    authorization: the first byte of the answer is 1 only when it lets the client in)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        probe.connect(str(x_socket(display)))
        probe.sendall(struct.pack("<cxHHHHxx", b"l", 11, 0, 0, 0))
        return probe.recv(1) != b"\x01"


def _xauthority_entries(cookies: dict[int | None, bytes]) -> bytes:
    """Xauthority records (libXau's format) of each display's cookie, for this host's name and for any address.
    A None display gives records the X server accepts but no client looks up (the number is not known yet)."""
    out = b""
    for display, cookie in cookies.items():
        number = b"" if display is None else str(display).encode()
        for family, address in ((FAMILY_LOCAL, socket.gethostname().encode()), (FAMILY_WILD, b"")):
            out += struct.pack(">H", family)
            for part in (address, number, COOKIE_NAME, cookie):
                out += struct.pack(">H", len(part)) + part
    return out


def _write_xauthority(path: Path, cookies: dict[int | None, bytes], *, owner: SessionUser | None = None) -> None:
    """Replace `path` at once (readers never see half a file) with these cookies, mode 0600, owned by `owner`."""
    fd, temporary = tempfile.mkstemp(prefix=".Xauthority-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(_xauthority_entries(cookies))
        if owner is not None:
            os.chown(temporary, owner.uid, owner.gid)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class ServiceAuthority:
    """This process's own X authority file: the cookie of every desktop it runs, for its own X connections.

    python-xlib and mss (libxcb) read the cookie from $XAUTHORITY when they connect, so from the first desktop on
    XAUTHORITY names this file: mode 0600 in a private directory, removed when the process exits.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cookies: dict[int | None, bytes] = {}
        self.path: Path | None = None
        self.base: Path | None = None  # where its private directory goes (default: the temporary directory)

    def place(self, base: Path) -> None:
        """Make the private directory under `base` (a service's sessions root), where a later start finds it if
        this process is killed before its exit handler runs; no effect once the file exists."""
        with self.lock:
            if self.path is None:
                base.mkdir(mode=0o700, parents=True, exist_ok=True)
                self.base = base

    def add(self, display: int, cookie: bytes) -> None:
        with self.lock:
            if self.path is None:
                directory = Path(tempfile.mkdtemp(prefix="sandbox-xauth-", dir=self.base))
                atexit.register(shutil.rmtree, directory, ignore_errors=True)
                self.path = directory / "Xauthority"
                os.environ["XAUTHORITY"] = str(self.path)
            self.cookies[display] = cookie
            _write_xauthority(self.path, self.cookies)

    def remove(self, display: int) -> None:
        with self.lock:
            if self.cookies.pop(display, None) is not None and self.path is not None:
                _write_xauthority(self.path, self.cookies)

    def close_if_unused(self) -> None:
        """Remove the private directory once no desktop of this process needs it (a service that stops on a
        signal may never run its exit handlers); the next desktop makes a new one."""
        with self.lock:
            if self.path is not None and not self.cookies:
                shutil.rmtree(self.path.parent, ignore_errors=True)
                self.path = None


SERVICE_AUTHORITY = ServiceAuthority()


def _run_as(user: SessionUser | None) -> list[str]:
    if user is None:
        return []
    return [*user.join_cgroup(), *user.drop_privileges()]


def _char_keysym(ch: str) -> int:
    """X keysym of a character: Latin-1 maps directly, everything else is 0x01000000 + code point."""
    point = ord(ch)
    return point if 0x20 <= point <= 0x7E or 0xA0 <= point <= 0xFF else 0x01000000 + point


def _read_display(fd: int, xvfb: subprocess.Popen, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    data = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        os.set_blocking(fd, False)
        while not data.endswith(b"\n"):
            if xvfb.poll() is not None:
                raise DesktopError(f"Xvfb exited with status {xvfb.returncode} before it was ready")
            if time.monotonic() > deadline:
                _stop_group(xvfb)
                raise DesktopError(f"Xvfb did not start within {timeout} s")
            try:
                data += pipe.read(16) or b""
            except BlockingIOError:
                time.sleep(0.005)
    return int(data.strip())


def _stop_group(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass


def available() -> bool:
    """Whether this machine has what a desktop needs (Xvfb, openbox, x11vnc)."""
    return all(shutil.which(tool) for tool in ("Xvfb", "openbox", "x11vnc"))
