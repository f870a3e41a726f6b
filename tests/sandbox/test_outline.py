"""The page outline (sandbox/outline.py): its text form, and on a real browser session of the sandbox service what it
reads (roles, labels, values, states, boxes of visible interactive elements only), and that the trainer's
SandboxEnv puts it in a browser task's observations in the model's frame."""

import uuid

import pytest

from sandbox.client import SandboxClient
from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.outline import Element, element_at, line, parse, render
from sandbox.suite.page import data_url

from ..servers import sandbox_service

API_KEY = "test-key-" + uuid.uuid4().hex
needs_sandbox = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)

PAGE = """<!doctype html><html><body style='margin:0;font:18px sans-serif'>
<button style='position:absolute;left:100px;top:50px;width:120px;height:40px'>Save</button>
<button style='position:absolute;left:300px;top:50px;display:none'>Hidden</button>
<label style='position:absolute;left:100px;top:150px;width:200px;height:40px'>
<input type='checkbox' checked>Apples</label>
<div style='position:absolute;left:100px;top:250px'><span>Name</span><input type='text' value='Ada'></div>
<div style='position:absolute;left:100px;top:350px'><span>Colour</span>
<select><option>red</option><option selected>blue</option></select></div>
<div style='position:absolute;left:500px;top:50px' onclick='1'>Open me</div>
<div style='position:absolute;left:500px;top:150px'>Just text</div>
<button style='position:absolute;left:100px;top:3000px'>Far below</button>
</body></html>"""


def test_lines_are_short_and_carry_the_state_and_the_centre_in_the_given_frame():
    box = Element("checkbox", "Apples", None, True, False, x=100, y=150, w=200, h=40)
    assert line(box) == 'checkbox "Apples" checked (200,170)'
    assert line(box, (2.0, 0.5)) == 'checkbox "Apples" checked (400,85)'
    field = Element("textbox", 'say "hi"', "Ada", None, True, x=0, y=0, w=10, h=10)
    assert line(field) == 'textbox "say \\"hi\\"" value="Ada" focused (5,5)'
    assert render([]) == "Interactive elements: none visible."
    assert render([box]).splitlines()[1] == line(box)
    inner = Element("button", "x", None, None, False, x=110, y=155, w=20, h=20)
    assert element_at([box, inner], 120, 160) == inner  # the smallest box holding the point
    assert element_at([box, inner], 400, 400) is None
    assert element_at([box], 400, 85, (2.0, 0.5)) == box


def test_a_malformed_outline_is_refused():
    with pytest.raises(ValueError, match="no element list"):
        parse({"w": 1})
    with pytest.raises(ValueError, match="malformed"):
        parse({"elements": [{"role": "button"}]})
    long = parse({"elements": [{"role": "button", "text": "x" * 300, "x": 0, "y": 0, "w": 1, "h": 1}] * 500})
    assert len(long) == 60 and len(long[0].text) == 40


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root, logs = tmp_path_factory.mktemp("sessions"), tmp_path_factory.mktemp("logs")
    with sandbox_service(root, logs, API_KEY, warm=0) as url:
        yield url


@needs_sandbox
def test_a_browser_session_outlines_its_visible_interactive_elements(service):
    client = SandboxClient(service, API_KEY, owner="outline-test")
    sid = client.allocate(ttl_s=120, kind="browser")["session_id"]
    try:
        client.setup(sid, [{"type": "chrome_open_tabs", "parameters": {"urls_to_open": [data_url(PAGE)]}}])
        found = {(e.role, e.text): e for e in client.outline(sid)}
        assert set(found) == {("button", "Save"), ("checkbox", "Apples"), ("textbox", "Name"),
                              ("combobox", "Colour"), ("item", "Open me")}  # fmt: skip
        save = found[("button", "Save")]
        assert (save.x, save.y, save.w, save.h) == (100, 50, 120, 40) and save.centre() == (160, 70)
        assert found[("checkbox", "Apples")].checked is True
        assert found[("textbox", "Name")].value == "Ada" and not found[("textbox", "Name")].focused
        assert found[("combobox", "Colour")].value == "blue"
        client.step(sid, "click(start_box='(200,263)')", coordinates="screen", observe=False)
        assert next(e for e in client.outline(sid) if e.role == "textbox").focused
    finally:
        client.release(sid)


@needs_sandbox
def test_the_trainers_environment_gives_browser_tasks_a_browser_and_the_outline(service, tmp_path):
    from sandbox.suite import make_task
    from training.envs import SandboxEnv, sandbox_options

    task = make_task("click-button", 1, "train", 1)
    env = SandboxEnv(SandboxClient(service, API_KEY, owner="outline-env"), task, tmp_path / "images", max_steps=2)
    try:
        messages = env.reset(seed=0)
        parts = messages[1]["content"]
        assert [p["type"] for p in parts] == ["image", "text"]
        assert parts[1]["text"].startswith("Interactive elements") and parts[1]["text"].count('button "') == 3
        assert "target" not in parts[1]["text"]
        feedback = env.step("Thought: I look.\nAction: scroll(direction='down')")
        assert [p["type"] for p in feedback.observation["content"]] == ["image", "text"]
    finally:
        env.close()
    plain = SandboxEnv(SandboxClient(service, API_KEY, owner="outline-env"), task, tmp_path / "images", outline=False)
    try:
        assert [p["type"] for p in plain.reset(seed=1)[1]["content"]] == ["image"]
    finally:
        plain.close()
    assert sandbox_options("sandbox:outline=0") == {"outline": False}
    with pytest.raises(ValueError, match="outline must be a boolean"):
        sandbox_options("sandbox:outline=maybe")
