"""Capture, used as a library on a real Xvfb desktop: input injected through XTEST (sandbox.desktop) is recorded in
order, with a decodable pre-action frame before every action, window titles, pause/resume (hotkey and API) and the
audio track; nothing is recorded while paused."""

from __future__ import annotations

import io
import subprocess
import time
import uuid

import numpy as np
import pytest
import soundfile
from PIL import Image

from recorder import Capture, FileAudio, RecorderError
from recorder.errors import CaptureError
from sandbox.actions import Click, Drag, Hotkey, Point, Press, Release, Scroll

from ..waiting import wait_for
from .conftest import make_wav, needs_desktop, read_events

pytestmark = needs_desktop

ACTIONS = ("down", "scroll", "key_down")


def titles(capture: Capture) -> str | None:
    return capture.stats().window


def test_a_session_on_a_real_display(desktop, tmp_path):
    typed = desktop.home / "typed.txt"
    script = f'read line; printf "%s" "$line" > {typed}; printf "\\033]2;typed %s\\007" "$line"; exec cat >/dev/null'
    desktop.launch(["xterm", "-T", "first window", "-geometry", "100x30+0+0", "-e", "sh", "-c", script])
    assert wait_for(lambda: any(cls == "XTerm" for cls, _ in desktop.windows()))
    wav = make_wav(tmp_path / "speech.wav", seconds=3.0)
    session_dir = tmp_path / "session"

    capture = Capture(
        session_dir,
        display=f":{desktop.display}",
        audio=FileAudio(wav),
        screenshot_interval=0.3,
        frame_interval=0.05,
        hotkey="ctrl+alt+p",
        task_id=12,
        instruction="Type hello into the terminal",
    ).start()
    try:
        assert wait_for(lambda: titles(capture) == "first window", 5), capture.stats()
        desktop.execute(Click(Point(100, 100)))
        desktop.execute(Drag(Point(200, 200), Point(400, 300)))
        desktop.execute(Scroll("down", Point(300, 300)))  # five notches at once: one scroll event
        desktop.type_text("hello\n")
        assert wait_for(lambda: typed.exists() and titles(capture) == "typed hello", 5), capture.stats()

        desktop.execute(Hotkey(("ctrl", "alt", "p")))
        assert wait_for(lambda: capture.paused, 5)
        desktop.execute(Click(Point(600, 400)))
        desktop.type_text("secret")
        desktop.launch(["xterm", "-T", "opened while paused", "-geometry", "40x10+700+0"])
        assert wait_for(lambda: ("XTerm", "opened while paused") in desktop.windows())
        desktop.execute(Click(Point(800, 60)))  # focus it: a window change nobody may see
        time.sleep(0.4)  # give the listener time to (not) record all that
        desktop.execute(Hotkey(("ctrl", "alt", "p")))
        assert wait_for(lambda: not capture.paused, 5)

        desktop.execute(Click(Point(100, 100)))  # back to the first window
        assert wait_for(lambda: titles(capture) == "typed hello", 5), capture.stats()
        desktop.type_text("x")
        assert wait_for(lambda: capture.stats().events["key_down"] >= 9, 5), capture.stats()
        capture.pause()
        desktop.type_text("y")
        time.sleep(0.3)
        capture.resume()
        assert not capture.paused
        time.sleep(0.4)  # a periodic frame or two
    finally:
        session = capture.stop()
    assert capture.error is None

    events = read_events(session_dir)
    # One clock, in file order; every event has it and a wall time.
    assert all(isinstance(e["t"], float) and isinstance(e["wall"], float) for e in events)
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)

    # The actions, in order (moves, key releases, frames and titles aside).
    def label(event):
        return event.get("button") or event.get("key")

    actions = [(e["type"], label(e)) for e in events if e["type"] in (*ACTIONS, "up", "pause", "resume")]
    assert actions == [
        ("down", "left"), ("up", "left"),  # click
        ("down", "left"), ("up", "left"),  # drag
        ("scroll", None),
        *[("key_down", k) for k in ("h", "e", "l", "l", "o", "enter")],
        ("key_down", "ctrl"), ("key_down", "alt"),  # the hotkey's modifiers; its "p" is not an action
        ("pause", None), ("resume", None),
        ("down", "left"), ("up", "left"), ("key_down", "x"),
        ("pause", None), ("resume", None),
    ]  # fmt: skip
    downs = [e for e in events if e["type"] in ("down", "up")]
    assert [(e["x"], e["y"]) for e in downs] == [(100, 100)] * 2 + [(200, 200), (400, 300)] + [(100, 100)] * 2
    drag = events[events.index(downs[2]) : events.index(downs[3])]
    assert any(e["type"] == "move" and (e["x"], e["y"]) == (400, 300) for e in drag)
    (scroll,) = [e for e in events if e["type"] == "scroll"]
    assert (scroll["x"], scroll["y"], scroll["dx"], scroll["dy"]) == (300, 300, 0, -5)

    # A decodable frame of the screen's size right before every action, at the action's time.
    for i, event in enumerate(events):
        if event["type"] in ACTIONS:
            shot = events[i - 1]
            assert (shot["type"], shot["reason"], shot["t"]) == ("screenshot", "pre_action", event["t"]), event
            image = Image.open(io.BytesIO((session_dir / shot["file"]).read_bytes()))
            assert (image.format, image.size) == ("JPEG", (desktop.width, desktop.height))
    assert any(e["type"] == "screenshot" and e["reason"] == "periodic" for e in events)
    referenced = {e["file"] for e in events if e["type"] == "screenshot"}
    assert referenced == {f"frames/{p.name}" for p in (session_dir / "frames").iterdir()}

    # Releases only of recorded presses.
    pressed: list[str] = []
    for event in events:
        if event["type"] == "key_down":
            pressed.append(event["key"])
        elif event["type"] == "key_up":
            assert event["key"] in pressed
            pressed.remove(event["key"])

    # Nothing at all between a pause and its resume.
    kinds = [e["type"] for e in events]
    for start in [i for i, k in enumerate(kinds) if k == "pause"]:
        assert kinds[start + 1] == "resume", kinds[start : start + 5]
    assert "secret" not in "".join(str(e.get("key")) for e in events) and '"y"' not in str(events)

    # The foreground window's title: at start, when the terminal renamed itself, after each resume.
    window_titles = [e["title"] for e in events if e["type"] == "window"]
    # after a resume: the window in front then (it came up and was clicked while paused)
    assert window_titles == ["first window", "typed hello", "opened while paused", "typed hello", "typed hello"]
    first_resume = kinds.index("resume")
    assert events[first_resume + 1]["type"] == "window" and events[first_resume + 1]["title"] == "opened while paused"
    assert typed.read_text() == "hello"  # the input really reached the application

    meta = session.meta()
    assert uuid.UUID(meta["session_id"])
    assert meta["format"] == 1 and meta["platform"] == "linux" and meta["recorder"].startswith("thinkaloud-recorder ")
    assert (meta["task_id"], meta["instruction"]) == (12, "Type hello into the terminal")
    assert meta["screen"] == {"width": desktop.width, "height": desktop.height, "scale": 1.0}
    assert abs(meta["started_wall"] - (events[0]["wall"] - events[0]["t"])) < 0.5

    # The audio file, copied as it was, starting when the capture started its audio.
    assert meta["audio"]["file"] == "audio.wav"
    assert 0.0 <= meta["audio"]["offset"] < events[1]["t"] + 1.0
    copied, rate = soundfile.read(str(session_dir / "audio.wav"), dtype="int16")
    original, _ = soundfile.read(str(wav), dtype="int16")
    assert rate == 16000 and np.array_equal(copied, original) and len(copied) / rate == pytest.approx(3.0)
    assert not (session_dir / ".recording").exists()


def test_unattended_capture_without_audio_nor_periodic_frames(desktop, tmp_path):
    """The server's use: a sandbox display, audio recorded elsewhere, only pre-action frames."""
    with Capture(tmp_path / "s", display=f":{desktop.display}", screenshot_interval=0, platform="sandbox") as capture:
        desktop.type_text("ab")
        assert wait_for(lambda: capture.stats().events["key_up"] == 2, 5)
    events = read_events(tmp_path / "s")
    assert [e["reason"] for e in events if e["type"] == "screenshot"] == ["pre_action", "pre_action"]
    # The screen did not change between the two keys (nothing shows them): one frame file serves both.
    assert len(list((tmp_path / "s" / "frames").iterdir())) == 1
    meta = capture.session.meta()
    assert meta["audio"] is None and meta["platform"] == "sandbox"
    assert (meta["task_id"], meta["instruction"]) == (None, "")  # instruction is always text


def test_a_held_hotkey_toggles_once_and_is_never_recorded(desktop, tmp_path):
    with Capture(
        tmp_path / "s", display=f":{desktop.display}", hotkey="ctrl+shift+f9", screenshot_interval=0
    ) as capture:
        desktop.execute(Press("ctrl"))
        desktop.execute(Press("shift"))
        for _ in range(4):  # the key held down: auto-repeat presses
            desktop.execute(Press("F9"))
        assert wait_for(lambda: capture.paused, 5)
        desktop.execute(Release("F9"))
        desktop.execute(Release("shift"))
        desktop.execute(Release("ctrl"))
        time.sleep(0.3)
        assert capture.paused  # once, not four times
        capture.resume()
        desktop.type_text("k")
        assert wait_for(lambda: capture.stats().events["key_up"] == 1, 5)
    keys = [(e["type"], e.get("key")) for e in read_events(tmp_path / "s") if e["type"] not in ("screenshot", "window")]
    assert keys == [
        ("key_down", "ctrl"), ("key_down", "shift"), ("pause", None), ("resume", None), ("key_down", "k"),
        ("key_up", "k"),
    ]  # fmt: skip


def test_input_injected_right_before_stop_is_all_recorded(desktop, tmp_path):
    """stop() right after the input, without waiting: every event the X server processed before the call is in the
    session (X RECORD's remaining data is drained, not cut off), whether the input came through this process's XTEST
    connection or another client (xdotool, as x11vnc injects VNC input); the scroll notches held back for merging
    are written too."""
    by_xdotool = [
        ("down", "left", (500, 400)), ("up", "left", (500, 400)), ("key_down", "c", None), ("key_up", "c", None),
    ]  # fmt: skip
    by_xtest = [
        ("down", "left", (100, 100)), ("up", "left", (100, 100)), ("scroll", None, (300, 200)),
        ("key_down", "a", None), ("key_up", "a", None), ("key_down", "b", None), ("key_up", "b", None),
    ]  # fmt: skip

    def xdotool() -> None:  # exits once the X server has its requests (XCloseDisplay syncs)
        command = ["xdotool", "mousemove", "500", "400", "click", "1", "key", "c"]
        subprocess.run(command, env=desktop.env(), check=True, timeout=10)

    def xtest() -> None:  # each action ends with a sync: the server has processed it when this returns
        desktop.execute(Click(Point(100, 100)))
        desktop.execute(Scroll("down", Point(300, 200)))
        desktop.type_text("ab")

    lost = []
    for i in range(20):  # the last input before stop() from this process's connection, then from another client
        capture = Capture(tmp_path / f"s{i}", display=f":{desktop.display}", screenshot_interval=0).start()
        first, second = (xdotool, xtest) if i % 2 == 0 else (xtest, xdotool)
        first()
        second()
        capture.stop()
        expected = by_xdotool + by_xtest if i % 2 == 0 else by_xtest + by_xdotool
        assert capture.error is None
        events = [e for e in read_events(tmp_path / f"s{i}") if e["type"] not in ("move", "screenshot", "window")]
        got = [(e["type"], e.get("button") or e.get("key"), (e["x"], e["y"]) if "x" in e else None) for e in events]
        if got != expected:
            lost.append((i, got))
    assert not lost, f"{len(lost)} of 20 stops lost events: {lost[:3]}"


def test_a_display_that_does_not_exist_is_a_clear_error_and_leaves_nothing(tmp_path):
    with pytest.raises(CaptureError, match="cannot open X display :4321"):
        Capture(tmp_path / "s", display=":4321").start()
    assert not (tmp_path / "s").exists()
    with pytest.raises(RecorderError, match="hotkey"):
        Capture(tmp_path / "s", hotkey="p")


def test_two_captures_of_two_displays_in_one_process(tmp_path):
    """Nothing depends on $DISPLAY: each capture sees its own display's input only."""
    from sandbox.desktop import Desktop

    first, second = Desktop.start(tmp_path / "a"), Desktop.start(tmp_path / "b")
    try:
        a = Capture(tmp_path / "ca", display=f":{first.display}", screenshot_interval=0).start()
        b = Capture(tmp_path / "cb", display=f":{second.display}", screenshot_interval=0).start()
        first.type_text("a")
        second.type_text("b")
        assert wait_for(lambda: a.stats().events["key_up"] and b.stats().events["key_up"], 5)
        a.stop()
        b.stop()
    finally:
        first.stop()
        second.stop()
    keys = {name: [e["key"] for e in read_events(tmp_path / name) if e["type"] == "key_down"] for name in ("ca", "cb")}
    assert keys == {"ca": ["a"], "cb": ["b"]}
