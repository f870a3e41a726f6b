"""The real noVNC client (vendored npm @novnc/novnc) in real Chromium, through websockify, to a session's desktop."""

import subprocess
import threading
import uuid
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from django.conf import settings
from playwright.sync_api import sync_playwright

from sandbox.browser import CHROMIUM, CHROMIUM_ARGS
from sandbox.desktop import Desktop, available
from sandbox.leases import LeaseStore
from sandbox.vnc import mint_token, websockify_command

from ..servers import ROOT, free_port, running, subprocess_env
from ..waiting import wait_for

pytestmark = pytest.mark.skipif(
    not (available() and Path(CHROMIUM).exists()), reason="needs X (Xvfb, openbox, x11vnc) and chromium"
)
VIEWER = """<!doctype html><html><head><title>waiting</title></head><body><div id="screen"></div>
<script type="module">
import RFB from "./novnc/core/rfb.js";
const rfb = new RFB(document.getElementById("screen"), new URLSearchParams(location.search).get("ws"));
rfb.viewOnly = true;
rfb.addEventListener("connect", () => { document.title = "connected"; });
rfb.addEventListener("disconnect", (e) => { document.title = "disconnected"; });
</script></body></html>"""


@pytest.fixture
def page_site(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "viewer.html").write_text(VIEWER)
    (tmp_path / "site" / "novnc").symlink_to(ROOT / "static" / "vendor" / "novnc")
    handler = lambda *a, **kw: SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "site"), **kw)  # noqa: E731
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_novnc_in_chromium_watches_a_leased_desktop_until_the_lease_ends(tmp_path, page_site):
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/12")
    namespace = f"test-{uuid.uuid4().hex}"
    store = LeaseStore(client, capacity=2, namespace=namespace)
    port = free_port()
    command = websockify_command(f"127.0.0.1:{port}", f"{settings.REDIS_URL}/12", namespace, [page_site])
    desktop = Desktop.start(tmp_path / "home")
    session_id = "s" + uuid.uuid4().hex[:8]
    store.acquire("annotation-app", ttl_s=60, session_id=session_id)
    listening = lambda: bool(subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout)  # noqa: E731
    try:
        assert wait_for(desktop.vnc_socket.exists)
        with running(command, subprocess_env(), tmp_path / "websockify.log", listening), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", *CHROMIUM_ARGS])
            token = mint_token(store, session_id, "annotation-app", "user:7", desktop.vnc_socket, ttl_s=30)
            page = browser.new_page()
            page.goto(f"{page_site}/viewer.html?ws=ws://127.0.0.1:{port}/?token={token}")
            page.wait_for_function("document.title === 'connected'", timeout=15_000)
            size = page.evaluate("[document.querySelector('canvas').width, document.querySelector('canvas').height]")
            assert size == [desktop.width, desktop.height]
            store.release(session_id, "annotation-app")  # the lease ends: the same token no longer opens it
            page.goto(f"{page_site}/viewer.html?ws=ws://127.0.0.1:{port}/?token={token}")
            page.wait_for_function("document.title === 'disconnected'", timeout=15_000)
            browser.close()
    finally:
        desktop.stop()
        for key in client.scan_iter(f"{namespace}:*"):
            client.delete(key)
