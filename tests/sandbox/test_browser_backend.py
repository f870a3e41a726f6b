"""The browser backend in real Chromium: actions, navigation, screenshots and JavaScript verifiers on a game page."""

import io
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from sandbox.actions import parse_actions
from sandbox.browser import CHROMIUM, BrowserSession
from sandbox.coordinates import ScreenMapping
from sandbox.desktop import UnsupportedAction

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/bootstrap)")

GAME = """<!doctype html><html><body style="margin:0">
<button id="hit" style="position:absolute;left:100px;top:100px;width:200px;height:100px"
  onclick="window.score = (window.score || 0) + 1">+1</button>
<input id="name" style="position:absolute;left:100px;top:300px;width:300px;height:40px">
<form onsubmit="window.submitted = document.getElementById('name').value; return false"
  style="position:absolute;left:100px;top:400px"><input id="q"></form>
<a id="next" href="/next.html" style="position:absolute;left:100px;top:500px">next level</a>
</body></html>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "game.html").write_text(GAME)
    (root / "next.html").write_text("<html><body><script>window.level = 2</script>level 2</body></html>")
    handler = lambda *a, **kw: SimpleHTTPRequestHandler(*a, directory=str(root), **kw)  # noqa: E731
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    session = BrowserSession(tmp_path_factory.mktemp("profile"))
    yield session
    session.close()


def test_actions_and_verifiers_on_a_game_page(browser, site):
    browser.new_page(f"{site}/game.html")
    mapping = ScreenMapping(browser.width, browser.height)
    x, y = mapping.to_model(200, 150)  # the button's centre, in the model's coordinates
    for action in parse_actions(f"click(start_box='({x},{y})')\n\nleft_double(start_box='({x},{y})')"):
        browser.execute(action, mapping)
    assert browser.evaluate("window.score") == 3
    browser.execute(parse_actions("click(start_box='(250,320)')")[0])  # screen pixels: the text input
    browser.execute(parse_actions("type(content='Zoë ✓')")[0])
    browser.execute(parse_actions("hotkey(key='ctrl a')")[0])
    browser.execute(parse_actions("type(content='replaced\\n')")[0])
    assert browser.evaluate("document.getElementById('name').value") == "replaced"
    browser.execute(parse_actions("click(start_box='(130,505)')")[0])  # the "next level" link
    browser.wait_for_url("**/next.html")
    assert browser.evaluate("window.level") == 2
    browser.execute(parse_actions("navigate_back()")[0])
    assert browser.url.endswith("/game.html")
    browser.execute(parse_actions(f"navigate(content='{site}/next.html')")[0])
    assert browser.evaluate("document.body.innerText").strip() == "level 2"


def test_screenshots_and_refusals(browser, site):
    browser.new_page(f"{site}/game.html")
    image = Image.open(io.BytesIO(browser.screenshot((1288, 812))))
    assert (image.format, image.size) == ("JPEG", (1288, 812))
    with pytest.raises(UnsupportedAction, match="open_app is not a browser action"):
        browser.execute(parse_actions("open_app(app_name='Settings')")[0])
