"""The ways out of a sandbox session are closed, seen from inside a session's shell with isolation on: no route to
the host's loopback services, no other session's X display, no other session's files."""

import contextlib
import os
import socket
import subprocess
import threading
import uuid
from dataclasses import replace
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandbox.browser import CHROMIUM, BrowserSession
from sandbox.desktop import Desktop, _read_display, _refuses_strangers, _stop_group, _write_xauthority, available
from sandbox.isolation import create_session_user, delete_session_user, isolation_available
from sandbox.sdk import Files, run_shell

pytestmark = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)

# The services on the host's loopback that a session must never reach (ports as scripts/env.sh sets them).
HOST_SERVICES = {
    "PostgreSQL": int(os.environ.get("PGPORT", "54320")),
    "Redis": int(os.environ.get("REDIS_PORT", "63790")),
    "sandbox service": int(os.environ.get("SANDBOX_PORT", "8010")),
    "policy server": int(os.environ.get("POLICY_PORT", "8020")),
}


@pytest.fixture
def make_session(tmp_path):
    """Factory: a session user with a running desktop; `user` is the one its shell commands run as."""
    started = []

    def make() -> Desktop:
        user = create_session_user(uuid.uuid4().hex[:12], tmp_path / "sessions")
        try:
            desktop = Desktop.start(user.home, user=user)
        except BaseException:
            delete_session_user(user)
            raise
        started.append(desktop)
        return desktop

    yield make
    for desktop in started:
        desktop.stop()
        delete_session_user(desktop.user)


@pytest.fixture
def host_services():
    """Something listens on each service's port of the host's loopback: the service itself where it runs, else a
    stand-in this test opens, so that a refused connection from a session means it can't get there."""
    with contextlib.ExitStack() as stack:
        for port in HOST_SERVICES.values():
            listener = socket.socket()
            try:
                listener.bind(("127.0.0.1", port))
            except OSError:  # the real service (or something else) listens there already
                listener.close()
                continue
            stack.callback(listener.close)
            listener.listen()
        for port in HOST_SERVICES.values():
            socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the host itself gets through
        yield HOST_SERVICES


def test_a_session_reaches_none_of_the_hosts_loopback_services(make_session, host_services):
    user = make_session().user
    for name, port in host_services.items():
        result = run_shell(user, f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected", timeout_s=10)
        assert "connected" not in result.stdout and result.exit_code != 0, (name, port, result)
        assert "refused" in result.stderr or "unreachable" in result.stderr, (name, result.stderr)
    # The reason: a network namespace of its own, with nothing but a loopback of its own.
    interfaces = run_shell(user, "tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()
    assert interfaces == ["lo"]
    # psql is on the read-only root, and still gets nowhere.
    result = run_shell(user, f"psql -h 127.0.0.1 -p {host_services['PostgreSQL']} -U annotation -c 'select 1'")
    assert result.exit_code != 0 and "Connection refused" in result.stderr, result


def test_a_session_opens_its_own_display_and_no_other(make_session):
    alice, bob = make_session().user, make_session().user
    # Her own display: its socket, DISPLAY and her cookie are all she needs (so the refusals below mean something).
    mine = run_shell(alice, "xdotool getdisplaygeometry")
    assert mine.stdout.split() == ["1280", "800"], mine
    assert run_shell(alice, "ls -A /tmp/.X11-unix").stdout.split() == [f"X{alice.display}"]
    # Bob's display without its socket: not mounted, and the abstract socket is gone with the host's network.
    other = f"DISPLAY=:{bob.display} xdotool getdisplaygeometry"
    result = run_shell(alice, other)
    assert result.exit_code != 0 and "1280" not in result.stdout, result
    # Bob's display with its socket mounted in her sandbox: the X server wants Bob's cookie, which she lacks...
    peeking = replace(alice, display=bob.display)
    result = run_shell(peeking, f"{other} || DISPLAY=:{bob.display} xdotool type hello")
    assert result.exit_code != 0 and "1280" not in result.stdout, result
    # ... even when she offers her own cookie for Bob's display.
    cookie = _cookie_of(alice.xauthority, alice.display)
    _write_xauthority(alice.xauthority, {alice.display: cookie, bob.display: cookie}, owner=alice)
    result = run_shell(peeking, other)
    assert result.exit_code != 0 and "1280" not in result.stdout, result
    # Outside any sandbox too (her user on the host's network namespace, as her X server runs): refused.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(alice.home), "XAUTHORITY": str(alice.xauthority)}
    outside = subprocess.run(
        [*alice.drop_privileges(), "xdotool", "getdisplaygeometry"], env={**env, "DISPLAY": f":{bob.display}"},
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert outside.returncode != 0 and "1280" not in outside.stdout, outside


@pytest.mark.parametrize("with_cookie", [True, False])
def test_the_check_that_a_desktop_refuses_clients_without_its_cookie_can_fail(tmp_path, with_cookie):
    """Desktop.start refuses to go on with an X server that lets strangers in (e.g. one that could not read its
    -auth file): the check says no for a server started without a cookie."""
    _write_xauthority(tmp_path / "auth", {None: os.urandom(16)})
    read_fd, write_fd = os.pipe()
    command = ["Xvfb", "-displayfd", str(write_fd), "-nolisten", "tcp"]
    command += ["-auth", str(tmp_path / "auth")] if with_cookie else []
    xvfb = subprocess.Popen(command, pass_fds=(write_fd,), stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(write_fd)
    try:
        assert _refuses_strangers(_read_display(read_fd, xvfb, 10.0)) is with_cookie
    finally:
        _stop_group(xvfb)


def test_a_session_reads_none_of_another_sessions_files(make_session):
    alice, bob = make_session().user, make_session().user
    Files(bob).write("secret.txt", b"bob's secret")
    for command in [f"cat {bob.home}/secret.txt", f"ls -A {bob.home}", f"cat {bob.xauthority}"]:
        result = run_shell(alice, command)
        assert "bob's secret" not in result.stdout and "secret.txt" not in result.stdout, (command, result)
        assert result.exit_code != 0 or result.stdout.strip() == "", (command, result)
    assert run_shell(alice, f"ls -A {bob.home.parent}").stdout.split() == [alice.home.name]  # hers alone
    # Not even as her user outside the sandbox, where the other homes are not hidden: 0700 and someone else's.
    outside = subprocess.run(
        [*alice.drop_privileges(), "cat", str(bob.home / "secret.txt"), str(bob.xauthority)], capture_output=True
    )
    assert outside.returncode != 0 and b"bob's" not in outside.stdout


def _cookie_of(path, display: int) -> bytes:
    from Xlib.xauth import FamilyLocal, Xauthority

    return Xauthority(str(path)).get_best_auth(FamilyLocal, socket.gethostname().encode(), display)[1]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/bootstrap)")
def test_a_browser_session_reaches_nothing_on_the_hosts_loopback(tmp_path):
    """Chromium runs in the session's network namespace too (Playwright drives it over a pipe, not a TCP port)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<title>host page</title>")
    handler = lambda *a, **kw: SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "site"), **kw)  # noqa: E731
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    user = create_session_user(uuid.uuid4().hex[:12], tmp_path / "sessions")
    browser = None
    try:
        browser = BrowserSession(user.home / ".browser-profile", user=user)
        with pytest.raises(Exception, match="ERR_CONNECTION_REFUSED"):
            browser.new_page(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        Files(user).write("page.html", b"<title>session page</title>")
        browser.new_page(f"file://{user.home}/page.html")  # what a task puts in the session opens
        assert browser.evaluate("document.title") == "session page"
    finally:
        if browser is not None:
            browser.close()
        delete_session_user(user)
        server.shutdown()
