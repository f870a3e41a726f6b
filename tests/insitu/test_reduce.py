"""Event reduction to UI-TARS actions, key frames, the event-log checks, and thought–action alignment."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from annotation_app.insitu.align import Attach, align
from annotation_app.insitu.events import EventLogError, check_event, parse_lines
from annotation_app.insitu.reduce import reduce_events
from sandbox.actions import format_action


class Log:
    """Builds an event list with a running clock, the way a recorder would write it."""

    def __init__(self) -> None:
        self.t = 0.0
        self.events: list[dict] = []

    def at(self, dt: float) -> Log:
        self.t += dt
        return self

    def add(self, kind: str, **fields) -> Log:
        self.events.append({"t": round(self.t, 4), "wall": 1_795_000_000 + self.t, "type": kind, **fields})
        self.t += 0.01
        return self

    def click(self, x: int, y: int, button: str = "left") -> Log:
        return self.add("down", x=x, y=y, button=button).add("up", x=x, y=y, button=button)

    def keys(self, *names: str) -> Log:
        for name in names:
            self.add("key_down", key=name).add("key_up", key=name)
        return self

    def type(self, text: str) -> Log:
        return self.keys(*text)

    def actions(self) -> list[str]:
        return [format_action(a.action) for a in reduce_events(self.events).actions]


def test_clicks_double_right_and_drag():
    log = Log().click(10, 20).at(1).click(100, 100).at(0.1).click(101, 101).at(1).click(50, 50, "right").at(1)
    log.add("down", x=5, y=5, button="left").add("move", x=50, y=5).add("up", x=200, y=300, button="left")
    assert log.actions() == [
        "click(start_box='<|box_start|>(10,20)<|box_end|>')",
        "left_double(start_box='<|box_start|>(100,100)<|box_end|>')",
        "right_single(start_box='<|box_start|>(50,50)<|box_end|>')",
        "drag(start_box='<|box_start|>(5,5)<|box_end|>', end_box='<|box_start|>(200,300)<|box_end|>')",
    ]


def test_two_clicks_far_apart_or_slow_stay_two_clicks():
    assert len(Log().click(10, 10).at(0.1).click(60, 60).actions()) == 2
    assert len(Log().click(10, 10).at(0.9).click(10, 10).actions()) == 2
    # a triple click is a double click then a click
    assert [a.split("(")[0] for a in Log().click(5, 5).click(5, 5).click(5, 5).actions()] == ["left_double", "click"]


def test_typing_merges_keystrokes_applies_backspace_and_enter_submits():
    log = Log().keys("shift").type("Helo").keys("backspace", "l", "o").keys("space").type("w!")
    log.keys("enter")
    reduced = reduce_events(log.events).actions
    assert [format_action(a.action) for a in reduced] == ["type(content='Hello w!\\n')"]
    assert reduced[0].amount == 11  # keystrokes, backspaces included


def test_backspace_with_nothing_typed_is_a_hotkey_and_hotkeys_break_typing():
    log = Log().keys("backspace").type("ab")
    log.add("key_down", key="ctrl_l").keys("s").add("key_up", key="ctrl_l").type("c").keys("tab", "f5")
    assert log.actions() == [
        "hotkey(key='backspace')",
        "type(content='ab')",
        "hotkey(key='ctrl s')",
        "type(content='c')",
        "hotkey(key='tab')",
        "hotkey(key='f5')",
    ]


def test_shifted_characters_type_but_shift_with_a_named_key_is_a_hotkey():
    log = Log().add("key_down", key="shift").keys("A", "tab").add("key_up", key="shift")
    assert log.actions() == ["type(content='A')", "hotkey(key='shift tab')"]


@pytest.mark.parametrize("altgr", ["altgr", "alt_gr", "ISO_Level3_Shift", "Mode_switch"])
def test_characters_typed_through_altgr_are_text_not_alt_hotkeys(altgr):
    log = Log().type("a").add("key_down", key=altgr).keys("@").add("key_up", key=altgr).type("b")
    assert log.actions() == ["type(content='a@b')"]
    # AltGr selects a level: with a named key it adds nothing, and a lone tap is no action; real Alt still chords
    log = Log().add("key_down", key=altgr).keys("left").add("key_up", key=altgr).keys(altgr)
    assert log.add("key_down", key="alt_l").keys("f").add("key_up", key="alt_l").actions() == [
        "hotkey(key='left')",
        "hotkey(key='alt f')",
    ]


def test_lone_super_tap_is_an_action_but_lone_shift_or_ctrl_is_not():
    log = Log().keys("shift", "ctrl", "cmd")
    assert log.actions() == ["hotkey(key='cmd')"]


def test_scrolls_merge_with_their_amount_and_split_on_direction_gap_or_place():
    log = Log()
    for _ in range(5):
        log.add("scroll", x=300, y=300, dx=0, dy=-1).at(0.05)
    log.add("scroll", x=300, y=300, dx=0, dy=2).at(2).add("scroll", x=300, y=300, dx=0, dy=1)
    log.at(0.1).add("scroll", x=900, y=300, dx=-1, dy=0)
    reduced = reduce_events(log.events).actions
    assert [(a.action.direction, a.amount) for a in reduced] == [("down", 5), ("up", 2), ("up", 1), ("left", 1)]
    assert reduced[0].to_json() == {"type": "scroll", "direction": "down", "point": [300, 300], "amount": 5}


def test_key_frames_show_the_previous_actions_result():
    log = Log().add("screenshot", file="frames/0.jpg").at(1).add("screenshot", file="frames/1.jpg")
    log.click(10, 10).at(0.5).add("screenshot", file="frames/2.jpg").at(0.5).click(300, 300).click(400, 400)
    frames = [(a.frame, a.frame_stale) for a in reduce_events(log.events).actions]
    # the third click had no screenshot after the second: it gets frames/2.jpg, flagged stale
    assert frames == [("frames/1.jpg", False), ("frames/2.jpg", False), ("frames/2.jpg", True)]


def test_paused_stretch_drops_held_keys_and_lost_release_still_clicks():
    log = Log().add("key_down", key="ctrl").add("pause").at(5).add("resume").type("x")
    log.add("down", x=1, y=1, button="left").add("down", x=2, y=2, button="left").add("up", x=2, y=2, button="left")
    reduction = reduce_events(log.events)
    assert [format_action(a.action) for a in reduction.actions] == [
        "type(content='x')",
        "click(start_box='<|box_start|>(1,1)<|box_end|>')",
        "click(start_box='<|box_start|>(2,2)<|box_end|>')",
    ]
    assert "had no release" in reduction.warnings[0]


def test_event_log_orders_by_monotonic_clock_and_reports_jumps():
    lines = [
        json.dumps({"t": 1.0, "wall": 100.0, "type": "key_down", "key": "a"}),
        "",
        json.dumps({"t": 0.5, "wall": 99.5, "type": "key_down", "key": "b"}),
        json.dumps({"t": 2.0, "wall": 3700.0, "type": "key_down", "key": "c"}),  # NTP moved the wall clock an hour
    ]
    log = parse_lines(lines)
    assert [e["key"] for e in log.events] == ["b", "a", "c"]
    assert "out of order" in log.warnings[0] and "wall clock jumped (+3599.0 s" in log.warnings[1]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "events.jsonl:1: not valid JSON"),
        ('{"t": 1, "type": "teleport"}', "unknown event type 'teleport'"),
        ('{"type": "down", "x": 1, "y": 2, "button": "left"}', "`t` must be a number"),
        ('{"t": -1, "type": "pause"}', "`t` must be seconds"),
        ('{"t": 1, "type": "down", "x": 1, "y": 2, "button": "thumb"}', "`button` must be one of"),
        ('{"t": 1, "type": "key_down", "key": ""}', "`key` must be a non-empty string"),
        ('{"t": 1, "type": "screenshot", "file": "../../etc/passwd"}', "relative path inside the capture"),
        ("[1, 2]", "must be a JSON object"),
        # pointer moves take a fast path; one that fails it is judged by check_event, field by field
        ('{"t": 1, "type": "move", "x": true, "y": 2}', "events.jsonl:1: `x` must be a number, got True"),
        ('{"t": 1, "type": "move", "x": 1, "y": "2"}', "events.jsonl:1: `y` must be a number, got '2'"),
        ('{"t": 1, "type": "move", "x": 1}', "events.jsonl:1: `y` must be a number, got None"),
        ('{"t": 1, "wall": null, "type": "move", "x": 1, "y": 2}', "events.jsonl:1: `wall` must be a number"),
        ('{"t": -0.5, "type": "move", "x": 1, "y": 2}', "events.jsonl:1: `t` must be seconds"),
        # NaN, Infinity and 1e400 are not JSON (orjson refuses them) but json.loads reads them: judged as before
        (
            '{"t": NaN, "type": "move", "x": 1, "y": 2}',
            "events.jsonl:1: `t` must be seconds since the session started, got nan",
        ),
        ('{"t": Infinity, "type": "move", "x": 1, "y": 2}', "`t` must be seconds since the session started, got inf"),
        ('{"t": 1e400, "type": "move", "x": 1, "y": 2}', "`t` must be seconds since the session started, got inf"),
        ('{"t": 1, "type": "move", "x": 1, "y": 2}{}', "events.jsonl:1: not valid JSON (Extra data: line 1 column 41"),
    ],
)
def test_bad_event_lines_name_the_line_and_field(line, message):
    with pytest.raises(EventLogError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_lines([line])


def test_a_bad_line_deep_in_a_large_log_names_its_line():
    good = [json.dumps({"t": i / 60, "wall": 1_795_000_000 + i / 60, "type": "move", "x": i % 1280, "y": 5}).encode()
            + b"\n" for i in range(60_000)]  # fmt: skip
    good[1000] = b"\n"  # blank lines are skipped but still counted
    good[2000] = b"   \r\n"
    assert len(parse_lines(good).events) == 59_998
    for number, line, message in [
        (31_337, b'{"t": 1, "type": "move", "x": 1, "y": 2\n', "events.jsonl:31337: not valid JSON (Expecting ','"),
        (45_001, b'{"t": 1, "type": "move", "x": false, "y": 2}\n', "events.jsonl:45001: `x` must be a number"),
        (59_999, b'{"t": 1, "type": "key_down", "key": "\xff"}\n', "events.jsonl:59999: not valid JSON ('utf-8' codec"),
        (60_000, b'{"t": 1, "type": "key_down"}\n', "events.jsonl:60000: `key` must be a non-empty string"),
    ]:
        lines = good.copy()
        lines[number - 1] = line
        with pytest.raises(EventLogError) as caught:
            parse_lines(lines)
        assert str(caught.value).startswith(message)


def test_lines_orjson_refuses_but_json_reads_are_accepted_as_before():
    bom = b'\xef\xbb\xbf{"t": 0, "type": "window", "title": "Inbox"}\n'  # a UTF-8 byte order mark
    surrogate = b'{"t": 1, "type": "key_down", "key": "\\ud83d"}\n'  # half a surrogate pair
    log = parse_lines([bom, surrogate, '{"t": 2, "type": "move", "x": 1, "y": 2}'])
    assert [e["type"] for e in log.events] == ["window", "key_down", "move"] and log.events[1]["key"] == "\ud83d"


@pytest.mark.parametrize(
    "fields",
    [
        {"x": 1, "y": 2},
        {"x": 1.5, "y": -2, "wall": 3},
        {"x": 1, "y": 2, "wall": "3"},
        {"x": None, "y": 2},
        {"x": [1], "y": 2},
        {"x": 1, "y": 2, "t": "0"},
        {"x": 1, "y": 2, "t": True},
        {"x": 1, "y": 2, "t": None},
        {"x": 1, "y": 2, "t": -0.0},
        {"x": 1, "y": 2, "t": 10**19},
    ],
)
def test_the_move_fast_path_agrees_with_check_event(fields):
    event = {"t": 0.25, "type": "move", **fields}
    try:
        check_event(dict(event), "events.jsonl:1")
    except EventLogError as exc:
        with pytest.raises(EventLogError, match=f"^{exc}$".replace("(", r"\(").replace("[", r"\[")):
            parse_lines([json.dumps(event)])
    else:
        assert parse_lines([json.dumps(event)]).events == [event]


def test_event_limit():
    with pytest.raises(EventLogError, match="more than 2 events"):
        parse_lines(['{"t": 0, "type": "pause"}'] * 3, max_events=2)


@dataclass
class W:
    text: str
    start: float
    end: float


def test_words_between_actions_become_the_following_actions_thought():
    log = Log().at(2).click(10, 10).at(3).type("hi").at(3)
    actions = reduce_events(log.events).actions  # click at t=2, typing from t=5.02
    words = [W(" I'll", 0.2, 0.5), W(" click", 0.5, 0.9), W(" now", 2.5, 2.8), W(" typing", 3.0, 3.4), W(" done", 8, 9)]
    steps = align(actions, words)
    assert [s.thought for s in steps] == ["I'll click", "now typing", "done"]
    assert steps[-1].action is None and steps[0].words[0] == {"text": " I'll", "start": 0.2, "end": 0.5}


def test_audio_offset_and_preceding_attachment():
    actions = reduce_events(Log().at(2).click(10, 10).at(3).click(50, 50).events).actions
    # clicks at t = 2 and t = 5; the audio started 1.5 s into the capture
    words = [W("first", 0.0, 0.3), W("opened", 1.0, 1.4), W("bye", 9, 9.5)]
    following = align(actions, words, audio_offset=1.5)
    assert [s.thought for s in following] == ["first", "opened", "bye"]
    preceding = align(actions, words, audio_offset=1.5, attach=Attach.PRECEDING)
    assert [s.thought for s in preceding] == ["first opened", "", "bye"]
