"""The real noVNC client (vendored npm @novnc/novnc) in real Chromium, through websockify, to a session's desktop."""

import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from sandbox.browser import CHROMIUM, CHROMIUM_ARGS
from sandbox.desktop import available
from sandbox.vnc import mint_token

from ..servers import ROOT

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


def test_novnc_in_chromium_watches_a_leased_desktop_until_the_lease_ends(bridge_for, page_site):
    bridge = bridge_for(page_site)
    viewer = f"{page_site}/viewer.html?ws={bridge.url}?token="
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", *CHROMIUM_ARGS])
        token = mint_token(bridge.store, bridge.session_id, "annotation-app", "user:7", bridge.vnc_socket, ttl_s=30)
        page = browser.new_page()
        page.goto(viewer + token)
        page.wait_for_function("document.title === 'connected'", timeout=15_000)
        size = page.evaluate("[document.querySelector('canvas').width, document.querySelector('canvas').height]")
        assert size == [bridge.desktop.width, bridge.desktop.height]
        bridge.store.release(bridge.session_id, "annotation-app")  # the lease ends: the same token no longer opens it
        page.goto(viewer + token)
        page.wait_for_function("document.title === 'disconnected'", timeout=15_000)
        browser.close()
