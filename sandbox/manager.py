"""Sessions on this host: a lease (shared store) + a user of its own + a desktop, with a warm pool and reclaim.

The lease store is shared by every service process; desktops are processes of the manager that started them. A
session whose lease expired, or whose desktop died, is reclaimed: its processes stopped, its user and home removed,
its lease dropped, and the reason reported.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .browser import BrowserSession
from .coordinates import ScreenMapping
from .desktop import Desktop, DesktopError
from .isolation import SessionUser, create_session_user, delete_session_user
from .leases import LeaseNotFound, LeaseStore, NotLeaseOwner

log = logging.getLogger(__name__)


class SessionLost(Exception):
    """The session is gone (its desktop died or its lease expired); it has been reclaimed."""


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

    # --- life of a session ------------------------------------------------------------------------------------------

    def _start(self, session_id: str | None = None, kind: str = "desktop") -> Session:
        session_id = session_id or secrets.token_hex(8)
        user = create_session_user(session_id, self.root) if self.isolate else None
        home = user.home if user else self.root / session_id
        try:
            if kind == "browser":
                home.mkdir(parents=True, exist_ok=True)
                browser = BrowserSession(home / ".browser-profile", *self.size, user=user)
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
        while len(self.pool) < self.warm:
            session = self._start()
            with self.lock:
                self.pool.append(session)
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
        if session.browser is not None:
            session.browser.close()
        if session.desktop is not None:
            session.desktop.stop()
        if session.user:
            delete_session_user(session.user)

    def shutdown(self) -> None:
        """Stop every session and warm desktop of this manager (their leases are released)."""
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
            pool, self.pool = self.pool, []
        for session in sessions:
            try:
                self.leases.release(session.session_id, session.owner)
            except LeaseNotFound:
                pass
            self._destroy(session)
        for session in pool:
            self._destroy(session)
