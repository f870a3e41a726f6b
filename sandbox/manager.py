"""Sessions on this host: a lease (shared store) + a user of its own + a desktop, with a warm pool and reclaim.

The lease store is shared by every service process; desktops are processes of the manager that started them. A
session whose lease expired, or whose desktop died, is reclaimed: its processes stopped, its user and home removed,
its lease dropped, and the reason reported.

A manager owns its sessions root (one per copy of the project): `claim_root()` locks it, so a second service on
the same root refuses to start, and removes what a run that crashed there left (its users, homes, cgroups,
processes, X files, launchers and leases), nothing of another root's. `shutdown()` releases everything it made.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .browser import BrowserSession
from .coordinates import ScreenMapping
from .desktop import SERVICE_AUTHORITY, Desktop, DesktopError, UnsupportedAction
from .isolation import SessionUser, create_session_user, delete_session_user, session_cgroup, session_users_under
from .isolation import remove_cgroup as remove_cgroup_dir
from .leases import LeaseError, LeaseNotFound, LeaseStore, NotLeaseOwner

log = logging.getLogger(__name__)


LAUNCHERS = ".launchers"  # Chromium launcher scripts of confined browser sessions, under the root (root's only)
SERVICE_XAUTH = ".service-xauth"  # the service's own X authority files, under the root
LOCK_FILE = ".service.lock"


class SessionLost(Exception):
    """The session is gone (its desktop died or its lease expired); it has been reclaimed."""


class RootInUse(RuntimeError):
    """Another live service holds this sessions root; two services on one root would reclaim each other's sessions."""


@dataclass
class Session:
    session_id: str
    desktop: Desktop | None
    user: SessionUser | None
    owner: str = ""
    browser: BrowserSession | None = None
    created: float = field(default_factory=time.time)
    # One caller at a time drives the desktop: its X connection is not thread-safe.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def kind(self) -> str:
        return "browser" if self.browser is not None else "desktop"

    @property
    def screen(self) -> Desktop | BrowserSession:
        """What actions and screenshots go to: the desktop, or the browser page."""
        screen = self.browser if self.browser is not None else self.desktop
        assert screen is not None
        return screen

    @property
    def mapping(self) -> ScreenMapping:
        return ScreenMapping(self.screen.width, self.screen.height)

    def is_alive(self) -> bool:
        return self.screen.is_alive()


class SessionManager:
    """Allocate, look up, renew, release and reclaim sessions; keep `warm` desktops ready to hand out."""

    def __init__(
        self,
        leases: LeaseStore,
        sessions_root: Path,
        *,
        isolate: bool,
        warm: int = 0,
        size: tuple[int, int] = (1280, 800),
    ) -> None:
        self.leases, self.root, self.isolate, self.warm, self.size = leases, sessions_root, isolate, warm, size
        self.sessions: dict[str, Session] = {}
        self.pool: list[Session] = []
        self.lock = threading.Lock()
        self._root_lock: int | None = None  # fd holding the root's flock, from claim_root() to shutdown()
        self._stopping = False  # set by shutdown(): a desktop that finishes starting after it is not kept

    # --- life of a session ------------------------------------------------------------------------------------------

    def _start(self, session_id: str | None = None, kind: str = "desktop") -> Session:
        session_id = session_id or secrets.token_hex(8)
        user = create_session_user(session_id, self.root) if self.isolate else None
        home = user.home if user else self.root / session_id
        try:
            if kind == "browser":
                home.mkdir(parents=True, exist_ok=True)
                launchers = self.root / LAUNCHERS
                browser = BrowserSession(home / ".browser-profile", *self.size, user=user, launchers=launchers)
                return Session(session_id, None, user, browser=browser)
            desktop = Desktop.start(home, *self.size, user=user)
            return Session(session_id, desktop, desktop.user)  # the user with its display: shells see that one
        except BaseException:
            if user:
                delete_session_user(user)
            raise

    def fill_warm_pool(self) -> int:
        """Start desktops until `warm` are ready; returns how many were started."""
        started = 0
        while not self._stopping and len(self.pool) < self.warm:
            session = self._start()
            with self.lock:
                kept = not self._stopping
                if kept:
                    self.pool.append(session)
            if not kept:  # shutdown() began while it started and has taken the pool already: it would outlive us
                self._destroy(session)
                break
            started += 1
        return started

    def allocate(self, owner: str, ttl_s: float, kind: str = "desktop") -> Session:
        """Lease a session (NoCapacity when full): a warm desktop when one is ready, else a fresh one; or a
        browser session (`kind="browser"`). The lease comes first, so a refused caller costs no desktop."""
        if kind not in ("desktop", "browser"):
            raise ValueError(f"unknown session kind {kind!r}; use 'desktop' or 'browser'")
        with self.lock:
            session = self.pool.pop() if self.pool and kind == "desktop" else None
        session_id = session.session_id if session else secrets.token_hex(8)
        try:
            self.leases.acquire(owner, ttl_s, session_id=session_id)
        except BaseException:
            if session is not None:
                with self.lock:
                    self.pool.append(session)
            raise
        try:
            if session is None or not session.is_alive():
                if session is not None:
                    self._destroy(session)
                session = self._start(session_id, kind)
        except BaseException:
            self.leases.release(session_id, owner)
            raise
        session.owner = owner
        with self.lock:
            self.sessions[session_id] = session
        return session

    def get(self, session_id: str, owner: str) -> Session:
        """The caller's live session; SessionLost (after reclaiming it) when its desktop died."""
        with self.lock:
            session = self.sessions.get(session_id)
        if session is None:
            raise LeaseNotFound(f"no session {session_id} on this host")
        if session.owner != owner:
            raise NotLeaseOwner(f"session {session_id} is leased by someone else")
        if not session.is_alive():
            self._reclaim(session_id, "its desktop died")
            raise SessionLost(f"session {session_id} is lost: its desktop died; it has been reclaimed")
        return session

    @contextmanager
    def driving(self, session: Session) -> Iterator[Desktop | BrowserSession]:
        """Exclusive use of a session's screen; if it dies meanwhile, the session is reclaimed (SessionLost)."""
        with session.lock:
            try:
                yield session.screen
            except DesktopError as exc:
                self._reclaim(session.session_id, "its desktop died")
                raise SessionLost(f"session {session.session_id} is lost: {exc}; it has been reclaimed") from exc

    def renew(self, session_id: str, owner: str, ttl_s: float | None = None) -> None:
        self.get(session_id, owner)
        self.leases.renew(session_id, owner, ttl_s)

    def reset(self, session_id: str, owner: str, ttl_s: float | None = None) -> Session:
        """Give the owner's browser session a fresh start for its next task (`BrowserSession.reset`) and renew its
        lease: what a caller playing episode after episode does instead of releasing and allocating again."""
        session = self.get(session_id, owner)
        if session.browser is None:
            raise UnsupportedAction("only a browser session can be reset; release a desktop and allocate another")
        self.leases.renew(session_id, owner, ttl_s)
        with self.driving(session):
            try:
                session.browser.reset()
            except Exception as exc:  # a browser that cannot reset is not fit for another task
                self._reclaim(session_id, "its browser failed to reset")
                raise SessionLost(f"session {session_id} is lost: its browser failed to reset ({exc})") from exc
        return session

    def release(self, session_id: str, owner: str) -> None:
        self.get(session_id, owner)
        self.leases.release(session_id, owner)
        with self.lock:
            session = self.sessions.pop(session_id)
        self._destroy(session)

    # --- reclaim --------------------------------------------------------------------------------------------------

    def reclaim(self) -> list[tuple[str, str]]:
        """Reclaim sessions whose lease expired or whose desktop died; returns (session id, reason) for each."""
        reclaimed = []
        for session_id in self.leases.reclaim_expired():
            if self._reclaim(session_id, "its lease expired", release_lease=False):
                reclaimed.append((session_id, "its lease expired"))
        with self.lock:
            dead = [s.session_id for s in self.sessions.values() if not s.is_alive()]
            dead_warm = [s for s in self.pool if not s.is_alive()]
            self.pool = [s for s in self.pool if s not in dead_warm]
        for session_id in dead:
            if self._reclaim(session_id, "its desktop died"):
                reclaimed.append((session_id, "its desktop died"))
        for session in dead_warm:
            self._destroy(session)
            reclaimed.append((session.session_id, "its warm desktop died"))
        return reclaimed

    def _reclaim(self, session_id: str, reason: str, *, release_lease: bool = True) -> bool:
        with self.lock:
            session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        log.warning("reclaiming session %s of %s: %s", session_id, session.owner, reason)
        if release_lease:
            try:
                self.leases.release(session_id, session.owner)
            except LeaseNotFound:
                pass
        self._destroy(session)
        return True

    def _destroy(self, session: Session) -> None:
        """Stop the session's browser and desktop and remove its user, home and cgroup: every part is tried even
        when an earlier one fails (a browser that died under a Ctrl-C must not keep its user alive)."""
        parts: list[tuple[str, Callable[[], None] | None]] = [
            ("browser", session.browser.close if session.browser else None),
            ("desktop", session.desktop.stop if session.desktop else None),
            ("user", (lambda: delete_session_user(session.user)) if session.user else None),  # type: ignore[arg-type]
        ]
        for what, stop in parts:
            if stop is None:
                continue
            try:
                stop()
            except Exception:
                log.exception("session %s: stopping its %s failed; going on", session.session_id, what)
        if session.user is None:  # without isolation the home is the service's own folder
            shutil.rmtree(self.root / session.session_id, ignore_errors=True)

    def shutdown(self) -> None:
        """Stop every session and warm desktop of this manager, in parallel (a supervisor gives a few seconds):
        leases released, browsers closed, desktops stopped, users, homes and cgroups removed; the root is let go."""
        with self.lock:
            self._stopping = True
            sessions, self.sessions = list(self.sessions.values()), {}
            pool, self.pool = self.pool, []
        for session in sessions:
            try:
                self.leases.release(session.session_id, session.owner)
            except (LeaseError, OSError, ConnectionError) as exc:  # gone already, or Redis is down: it expires
                log.info("session %s: its lease was not released (%s)", session.session_id, exc)
            except Exception:
                log.exception("session %s: releasing its lease failed", session.session_id)
        everything = sessions + pool
        if everything:
            with ThreadPoolExecutor(max_workers=min(8, len(everything)), thread_name_prefix="shutdown") as workers:
                list(workers.map(self._destroy, everything))
        shutil.rmtree(self.root / LAUNCHERS, ignore_errors=True)
        SERVICE_AUTHORITY.close_if_unused()
        if self._root_lock is not None:
            os.close(self._root_lock)
            self._root_lock = None

    # --- what an earlier run left -------------------------------------------------------------------------------

    def claim_root(self) -> list[str]:
        """Lock this manager's sessions root (RootInUse when another live service holds it) and reclaim what a run
        that stopped without shutting down (SIGKILL, a crash, power) left there; returns the session ids reclaimed.
        Only this root is looked at: another copy of the project, with a root of its own, is never touched."""
        if self._root_lock is not None:
            return []
        self._stopping = False
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RootInUse(
                f"another sandbox service uses the sessions root {self.root}; give each copy its own SANDBOX_ROOT"
            ) from None
        self._root_lock = fd
        SERVICE_AUTHORITY.place(self.root / SERVICE_XAUTH)
        return self._reclaim_leftovers()

    def _reclaim_leftovers(self) -> list[str]:
        users = {user.home.name: user for user in session_users_under(self.root)}
        homes = {path.name for path in self.root.iterdir() if path.is_dir() and path.name.isalnum()}
        reclaimed = sorted(set(users) | homes)
        for session_id in reclaimed:
            log.warning("reclaiming session %s, left in %s by an earlier run", session_id, self.root)
            if session_id in users:
                delete_session_user(users[session_id])
            else:  # no user (never isolated, or removed before the crash): its home and a cgroup may be left
                shutil.rmtree(self.root / session_id, ignore_errors=True)
                cgroup = session_cgroup(f"sbx-{session_id[:24]}")
                if cgroup is not None:
                    remove_cgroup_dir(cgroup)
            self._drop_lease(session_id)
        shutil.rmtree(self.root / LAUNCHERS, ignore_errors=True)
        for leftover in (self.root / SERVICE_XAUTH).glob("*"):
            if SERVICE_AUTHORITY.path is None or leftover != SERVICE_AUTHORITY.path.parent:
                shutil.rmtree(leftover, ignore_errors=True)
        return reclaimed

    def _drop_lease(self, session_id: str) -> None:
        """Release the lease a reclaimed session still holds in this manager's store (it would block capacity)."""
        owner = self.leases.client.hget(self.leases.keys[1] + session_id, "owner")
        if owner is not None:
            try:
                self.leases.release(session_id, owner.decode() if isinstance(owner, bytes) else owner)
            except LeaseError:
                pass
