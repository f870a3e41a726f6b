"""The session manager with real desktops, users and Redis leases: pool, capacity, loss and reclaim."""

import subprocess
import threading
import time

import pytest

from sandbox.actions import Click, Point
from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.leases import LeaseStore, NoCapacity, NotLeaseOwner
from sandbox.manager import SessionLost, SessionManager
from sandbox.sdk import Files, run_shell

from ..waiting import wait_for

pytestmark = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)


@pytest.fixture
def manager(tmp_path, client, namespace):
    manager = SessionManager(LeaseStore(client, capacity=2, namespace=namespace), tmp_path / "s", isolate=True, warm=1)
    yield manager
    manager.shutdown()


def test_warm_pool_capacity_and_release(manager):
    assert manager.fill_warm_pool() == 1
    warm_id = manager.pool[0].session_id
    started = time.perf_counter()
    first = manager.allocate("alice", ttl_s=30)
    assert first.session_id == warm_id and time.perf_counter() - started < 0.5
    second = manager.allocate("bob", ttl_s=30)  # pool empty: a fresh desktop
    with pytest.raises(NoCapacity):
        manager.allocate("carol", ttl_s=30)
    assert not manager.pool and len(manager.sessions) == 2  # the refusal came before any desktop was started
    with pytest.raises(NotLeaseOwner):
        manager.release(first.session_id, "bob")
    manager.release(first.session_id, "alice")
    assert not first.user.home.exists() and not first.desktop.is_alive()
    assert manager.get(second.session_id, "bob").desktop.is_alive()


def test_a_dead_x_server_loses_the_session_and_nothing_else(manager):
    doomed, other = manager.allocate("alice", ttl_s=30), manager.allocate("bob", ttl_s=30)
    doomed.desktop.processes["xvfb"].kill()
    doomed.desktop.processes["xvfb"].wait()
    with pytest.raises(SessionLost, match="its desktop died"):
        manager.get(doomed.session_id, "alice")
    assert not doomed.user.home.exists()
    assert manager.leases.live_count() == 1
    manager.get(other.session_id, "bob").desktop.execute(Click(Point(5, 5)))  # undisturbed
    assert manager.allocate("carol", ttl_s=30)  # the slot is free again


def test_expired_leases_are_reclaimed(manager):
    session = manager.allocate("alice", ttl_s=0.2)
    time.sleep(0.3)
    assert manager.reclaim() == [(session.session_id, "its lease expired")]
    assert not session.desktop.is_alive() and not session.user.home.exists()
    assert manager.sessions == {}


def test_browser_sessions_run_chromium_as_the_session_user_and_keep_downloads(manager):
    session = manager.allocate("alice", ttl_s=60, kind="browser")
    # Chromium has the session's network namespace (no route to the host), so the task's page is a file in the
    # session, as OSWorld's upload_file puts it there.
    files = Files(session.user)
    files.write("site/report.csv", b"a,b\n1,2\n")
    files.write("site/index.html", b'<a id="dl" href="report.csv" download>get</a>')
    uids = subprocess.run(["pgrep", "-u", str(session.user.uid), "-f", "chromium"], capture_output=True, text=True)
    assert uids.stdout.split(), "no Chromium runs as the session user"
    session.browser.new_page(f"file://{session.user.home}/site/index.html")
    session.browser.execute(Click(Point(10, 10)))
    assert wait_for(lambda: (session.user.home / "Downloads" / "report.csv").exists())
    assert run_shell(session.user, "cat Downloads/report.csv").stdout == "a,b\n1,2\n"


def test_a_warm_desktop_that_finishes_starting_after_the_shutdown_is_not_kept(manager):
    """Stopping while the warm pool refills (the service's housekeeping thread) must not leave that desktop
    running: the shutdown has taken the pool already, so the filler drops what it finishes starting."""
    filler = threading.Thread(target=manager.fill_warm_pool)
    filler.start()
    started = lambda: manager.root.exists() and any(p.is_dir() for p in manager.root.iterdir())  # noqa: E731
    assert wait_for(started, timeout=30), "no desktop was started"
    manager.shutdown()  # in all likelihood while the desktop is still starting; either way nothing may be left
    filler.join(timeout=60)
    assert not filler.is_alive()
    assert manager.pool == [] and manager.sessions == {}
    assert [p.name for p in manager.root.iterdir() if p.is_dir() and p.name.isalnum()] == []
    assert manager.fill_warm_pool() == 0  # a stopped manager starts nothing more


def test_the_services_housekeeping_survives_a_desktop_that_would_not_start(manager, caplog):
    """One failed refill (a desktop that would not start) is logged and tried again at the next round; it used to
    end the housekeeping thread, and with it reclaiming and refilling until the service restarted."""
    from fastapi.testclient import TestClient

    from sandbox.desktop import DesktopError
    from sandbox.service import create_app

    start, failures = manager._start, []

    def start_once_failing(*args, **kwargs):
        if not failures:
            failures.append(time.monotonic())
            raise DesktopError("the window manager exited with status 1")  # what a broken start raises
        return start(*args, **kwargs)

    with TestClient(create_app(manager, "key", reclaim_every_s=0.2)):
        assert len(manager.pool) == 1  # the start filled the pool
        manager._start = start_once_failing  # the next desktop the housekeeping starts fails
        manager.release(manager.allocate("alice", ttl_s=30).session_id, "alice")  # takes the warm desktop
        assert wait_for(lambda: failures and len(manager.pool) == 1, timeout=60), "the pool was not refilled"
    failed = [r for r in caplog.records if r.name == "sandbox.service" and "housekeeping failed" in r.message]
    assert failed and failed[0].levelname == "ERROR" and "status 1" in str(failed[0].exc_info[1])
