"""The action grammar: real UI-TARS outputs, errors that say where, and round trips (hypothesis)."""

import math
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.action_regex import proposal_regex
from sandbox.actions import (
    COMPUTER_ACTIONS,
    DIRECTIONS,
    SPECS,
    ActionSyntaxError,
    CallUser,
    Click,
    Drag,
    Fail,
    Finished,
    Hotkey,
    Hover,
    LeftDouble,
    LongPress,
    Navigate,
    NavigateBack,
    Notation,
    OpenApp,
    ParsedStep,
    Point,
    Press,
    PressBack,
    PressHome,
    Release,
    RightSingle,
    Scroll,
    Type,
    Wait,
    action_from_dict,
    action_templates,
    action_to_dict,
    example_action,
    format_action,
    format_actions,
    format_step,
    parse_actions,
    parse_step,
)
from sandbox.coordinates import CoordinateMode, ScreenMapping
from sandbox.desktop import Desktop, available

from ..waiting import wait_for


def test_ui_tars_outputs():
    step = parse_step(
        "Thought: The search box is at the top; I'll click it and type the query.\n"
        "Action: click(start_box='<|box_start|>(235,512)<|box_end|>')\n\n"
        "type(content='weather in Paris\\n')"
    )
    assert step.thought.startswith("The search box")
    assert step.actions == [Click(Point(235, 512)), Type("weather in Paris\n")]


def test_every_notation_of_a_point():
    for text in [
        "click(start_box='<|box_start|>(10,20)<|box_end|>')",
        "click(start_box='(10,20)')",
        "click(start_box='[10, 20]')",
        "click(point='<point>10 20</point>')",
        "click(start_point='<point>10 20</point>')",
        "click(start_box='<|box_start|>(0,0,20,40)<|box_end|>')",  # a box: its centre
        "click(start_box='<bbox>0 0 20 40</bbox>')",
    ]:
        assert parse_actions(text) == [Click(Point(10, 20))], text


def test_reflection_form_and_all_action_types():
    step = parse_step(
        "Reflection: The last click missed.\nAction_Summary: Open the menu, then go back.\n"
        "Action: drag(start_box='(1,2)', end_box='(3,4)')\n\nhotkey(key='Ctrl Shift T')\n\n"
        "scroll(start_box='(5,6)', direction='down')\n\nscroll(direction='up')\n\nwait()\n\n"
        "left_double(start_box='(7,8)')\n\nright_single(point='<point>9 10</point>')\n\n"
        "navigate(content='https://example.org/?q=a&b=c')\n\nnavigate_back()\n\npress(key='shift')\n\n"
        "release(key='shift')\n\nlong_press(start_box='(1,1)')\n\nopen_app(app_name='Settings')\n\n"
        "press_home()\n\npress_back()\n\ncall_user()\n\nfinished(content='Done.')\n\nfinished()"
    )
    assert (step.reflection, step.action_summary, step.thought) == (
        "The last click missed.",
        "Open the menu, then go back.",
        "",
    )
    assert step.actions == [
        Drag(Point(1, 2), Point(3, 4)), Hotkey(("ctrl", "shift", "t")), Scroll("down", Point(5, 6)), Scroll("up"),
        Wait(), LeftDouble(Point(7, 8)), RightSingle(Point(9, 10)), Navigate("https://example.org/?q=a&b=c"),
        NavigateBack(), Press("shift"), Release("shift"), LongPress(Point(1, 1)), OpenApp("Settings"), PressHome(),
        PressBack(), CallUser(), Finished("Done."), Finished(),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message", "line", "column"),
    [
        ("Thought: hi\nAction: clik(start_box='(1,2)')", "unknown action 'clik'", 2, 9),
        ("Thought: hi\nAction: click(start_box='(1,2)'", "never closed with ')'", 2, 9),
        ("Action: click(start_box=(1,2))", "must be a quoted string", 1, 25),
        ("Action: click(start_box='near the top')", "is not a point", 1, 15),
        ("Action: click(box='(1,2)')", "needs start_box=", 1, 9),
        ("Action: click(start_box='(1,2)', point='(1,2)')", "say the same thing", 1, 34),
        ("Action: type(content='unterminated)", "never closed", 1, 22),
        ("Action: hotkey(key='ctrl alt shift del')", "1 to 3", 1, 16),
        ("Action: scroll(direction='sideways')", "direction must be one of", 1, 16),
        ("Action: wait(now='yes')", "has no parameter 'now'", 1, 14),
        ("Thought: nothing to do", "no 'Action:' section", 1, 23),
        ("Thought: x\nAction:   ", "no action given", 2, 8),
        ("hello\nThought: x\nAction: wait()", "unexpected text before", 1, 1),
        ("Action: wait()\nThought: later", "must be the last section", 1, 1),
        ("Action: wait() wait(", "wait(…) is never closed", 1, 16),
        ("Action: wait", "expected '(' after wait", 1, 13),
        ("Action: click(start_box='(1e999,5)')", "coordinate 1e999 is out of range", 1, 15),
        (f"Action: click(start_box='({'9' * 400},5)')", "(400 characters) is out of range", 1, 15),
        ("Action: click(start_box='<point>-200001 5</point>')", "coordinate -200001 is out of range", 1, 15),
        ("Action: drag(start_box='(1,2)', end_box='(3,1e309)')", "coordinate 1e309 is out of range", 1, 33),
        ("Action: scroll(start_box='(1,2)')", "scroll(…) needs direction=", 1, 9),
        ("Action: scroll(start_box='(1,2)', end_box='(1,2)')", "has no direction", 1, 9),
        ("Action: scroll(start_box='(1,2)', end_box='(1,9)', direction='up')", "direction= or end_box=", 1, 9),
        ("Action: long_press(start_box='(1,2)', time='soon')", "seconds between 0 and 60", 1, 39),
        ("\ufeff  Thought: a\n\t Thought: b\nAction: wait()", "the 'Thought' section appears twice", 2, 1),
    ],
)
def test_errors_say_what_and_where(text, message, line, column):
    with pytest.raises(ActionSyntaxError) as caught:
        parse_step(text)
    error = caught.value
    assert message in str(error)
    assert (error.line, error.column) == (line, column), str(error)


# --- property-based ----------------------------------------------------------------------------------------------

coordinates = st.one_of(st.integers(0, 10_000), st.floats(0, 10_000, allow_nan=False, allow_infinity=False))
seconds = st.none() | st.floats(0.001, 60, allow_nan=False)
points = st.builds(Point, coordinates, coordinates)
text = st.text(max_size=40)  # any Unicode, quotes, backslashes and newlines included
key = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
STRATEGIES = {
    Click: st.builds(Click, points), LeftDouble: st.builds(LeftDouble, points),
    RightSingle: st.builds(RightSingle, points), LongPress: st.builds(LongPress, points, seconds),
    Hover: st.builds(Hover, points), Fail: st.builds(Fail),
    Drag: st.builds(Drag, points, points), Hotkey: st.builds(Hotkey, st.lists(key, min_size=1, max_size=3).map(tuple)),
    Type: st.builds(Type, text), Scroll: st.builds(Scroll, st.sampled_from(DIRECTIONS), st.none() | points),
    Wait: st.builds(Wait), Finished: st.builds(Finished, text), CallUser: st.builds(CallUser),
    Navigate: st.builds(Navigate, text), NavigateBack: st.builds(NavigateBack), Press: st.builds(Press, key),
    Release: st.builds(Release, key), OpenApp: st.builds(OpenApp, text), PressHome: st.builds(PressHome),
    PressBack: st.builds(PressBack),
}  # fmt: skip
actions = st.one_of(*STRATEGIES.values())


def test_the_strategies_cover_every_action_type():
    assert {cls for cls, _ in SPECS.values()} == set(STRATEGIES)


@settings(max_examples=400)
@given(st.lists(actions, min_size=1, max_size=4), st.sampled_from(list(Notation)))
def test_format_then_parse_is_the_identity(parsed, notation):
    assert parse_actions(format_actions(parsed, notation)) == parsed
    for action in parsed:
        assert action_from_dict(action_to_dict(action)) == action


@settings(max_examples=200)
@given(st.lists(actions, min_size=1, max_size=3), text, text, st.sampled_from(list(Notation)))
def test_steps_round_trip(parsed, thought, reflection, notation):
    thought = " ".join(thought.split())  # sections are single-line here; leading/trailing space is not kept
    step = ParsedStep(thought=thought, actions=parsed, reflection=" ".join(reflection.split()))
    if any(h in step.thought + step.reflection for h in ("Action:", "Thought:", "Reflection:", "Action_Summary:")):
        return
    again = parse_step(format_step(step, notation))
    assert (again.actions, again.thought, again.reflection) == (step.actions, step.thought, step.reflection)


@settings(max_examples=1000)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes(garbage):
    for parse in (parse_step, parse_actions):
        try:
            parse(garbage)
        except ActionSyntaxError as error:
            assert 1 <= error.line and 1 <= error.column


@settings(max_examples=300)
@given(st.lists(actions, min_size=1, max_size=2), st.integers(0, 60), st.text(max_size=3))
def test_mangled_actions_never_crash(parsed, cut, noise):
    text = format_actions(parsed)
    mangled = text[:cut] + noise + text[cut:]
    try:
        parse_actions(mangled)
    except ActionSyntaxError:
        pass


def test_format_is_canonical():
    assert format_action(Click(Point(10, 20))) == "click(start_box='<|box_start|>(10,20)<|box_end|>')"
    assert format_action(Click(Point(10, 20)), Notation.POINT) == "click(point='<point>10 20</point>')"
    assert format_action(Type("it's\n")) == "type(content='it\\'s\\n')"
    assert format_action(Hotkey(("ctrl", "c"))) == "hotkey(key='ctrl c')"
    assert format_action(Scroll("down")) == "scroll(direction='down')"


def test_sandbox_never_imports_django():
    code = "import sys, sandbox.actions, sandbox.coordinates; sys.exit('django' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- UI-TARS compatibility: what the official converter accepts, read the same way ------------------------------------
# The expected screen points follow the official converter (bytedance/UI-TARS codes/ui_tars/action_parser.py),
# restated here from its formulas rather than from our code: `parse_action_to_structure_output` turns each number
# into a fraction of the image (absolute: x / smart-resized width, y / smart-resized height; v1: n / 1000), a box
# becomes its centre, and `parsing_response_to_pyautogui_code` multiplies by the screen size, rounded to 3 decimals.


def official_smart_resize(height: int, width: int) -> tuple[int, int]:
    """Qwen2.5-VL's resize as the official converter computes it (factor 28, 100·28² to 16384·28² pixels)."""
    factor, low, high = 28, 100 * 28 * 28, 16384 * 28 * 28
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > high:
        beta = math.sqrt(height * width / high)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < low:
        beta = math.sqrt(low / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def official_screen_point(numbers: list[float], width: int, height: int, mode: CoordinateMode) -> tuple[float, float]:
    """Screen pixel of a start_box/end_box value (2 numbers, or 4 for a box) by the official converter."""
    if mode == CoordinateMode.ABSOLUTE:
        resized_h, resized_w = official_smart_resize(height, width)
        fractions = [n / (resized_h if i % 2 else resized_w) for i, n in enumerate(numbers)]
    else:
        fractions = [n / 1000 for n in numbers]
    if len(fractions) == 2:
        fractions *= 2
    x1, y1, x2, y2 = fractions
    return round((x1 + x2) / 2 * width, 3), round((y1 + y2) / 2 * height, 3)


SCREENS = [(1920, 1080), (1280, 800), (5120, 2880)]  # the last one is scaled down (beyond 16384·28² pixels)
# (text with {a}, {b} for two points of the model's frame, our action type, our keys or direction if any)
UI_TARS_FORMS = [
    ("left_single(start_box='<|box_start|>({a})<|box_end|>')", "click"),
    ("left_single(start_box='({a},{b})')", "click"),  # a box: its centre
    ("hover(start_box='<|box_start|>({a})<|box_end|>')", "hover"),
    ("hover(point='<point>{a_}</point>')", "hover"),
    ("select(start_box='<|box_start|>({a})<|box_end|>', end_box='<|box_start|>({b})<|box_end|>')", "drag"),
    ("long_press(start_box='<|box_start|>({a})<|box_end|>', time='')", "long_press"),
    ("scroll(start_box='<|box_start|>({a})<|box_end|>', end_box='<|box_start|>({b})<|box_end|>')", "scroll"),
    ("click(start_box='<|box_start|>({a})<|box_end|>')", "click"),
    ("right_single(start_box='({a})')", "right_single"),
    ("left_double(start_box='[{a}]')", "left_double"),
    ("drag(start_point='<point>{a_}</point>', end_point='<point>{b_}</point>')", "drag"),
]


def _model_points(width: int, height: int, mode: CoordinateMode) -> tuple[list[int], list[int]]:
    """Two points of the model's frame, at about (30 %, 70 %) and (60 %, 20 %) of the image."""
    if mode == CoordinateMode.ABSOLUTE:
        resized_h, resized_w = official_smart_resize(height, width)
    else:
        resized_h, resized_w = 1000, 1000
    return [int(0.3 * resized_w), int(0.7 * resized_h)], [int(0.6 * resized_w), int(0.2 * resized_h)]


@pytest.mark.parametrize("mode", list(CoordinateMode))
@pytest.mark.parametrize(("width", "height"), SCREENS)
@pytest.mark.parametrize(("form", "kind"), UI_TARS_FORMS)
def test_ui_tars_forms_give_the_official_converters_action_and_screen_point(form, kind, width, height, mode):
    a, b = _model_points(width, height, mode)
    text = form.format(
        a=",".join(map(str, a)), b=",".join(map(str, b)), a_=" ".join(map(str, a)), b_=" ".join(map(str, b))
    )
    is_box = "({a},{b})" in form  # one 4-number box
    [action] = parse_step(f"Thought: t\nAction: {text}").actions
    assert action.name == kind
    mapping = ScreenMapping(width, height, mode)
    first = action.point if hasattr(action, "point") else action.start
    expected = official_screen_point(a + b if is_box else a, width, height, mode)
    assert all(abs(o - e) <= 1 for o, e in zip(mapping.to_screen(first.x, first.y), expected, strict=True)), text
    if isinstance(action, Drag):
        expected_end = official_screen_point(b, width, height, mode)
        got = mapping.to_screen(action.end.x, action.end.y)
        assert all(abs(o - e) <= 1 for o, e in zip(got, expected_end, strict=True)), text


def test_ui_tars_key_forms():
    assert parse_actions("hotkey(hotkey='alt tab')") == [Hotkey(("alt", "tab"))]
    assert parse_actions("keydown(key='shift')\n\nkeyup(key='shift')") == [Press("shift"), Release("shift")]
    for text in ("hotkey(key='ctrl+c')", "hotkey(key='Ctrl+C')", "hotkey(key='ctrl + c')", "hotkey(key='ctrl c')"):
        assert parse_actions(text) == [Hotkey(("ctrl", "c"))], text
    assert parse_actions("hotkey(key='ctrl +')") == [Hotkey(("ctrl", "+"))]  # the plus key itself
    assert parse_actions("hotkey(key='ctrl++')") == [Hotkey(("ctrl", "+"))]
    assert parse_actions("hotkey(key='ctrl+shift+t')") == [Hotkey(("ctrl", "shift", "t"))]
    with pytest.raises(ActionSyntaxError, match="1 to 3"):
        parse_actions("hotkey(key='ctrl+alt+shift+del')")


def test_the_v1_swipe_scrolls_against_the_fingers_direction():
    """scroll(start_box, end_box) is a finger's swipe: the content follows the finger, the view scrolls the other
    way, along the swipe's longer axis; the anchor is where the finger went down."""
    swipe = "scroll(start_box='({},{})', end_box='({},{})')"
    assert parse_actions(swipe.format(500, 800, 500, 200)) == [Scroll("down", Point(500, 800))]  # finger up
    assert parse_actions(swipe.format(500, 200, 510, 800)) == [Scroll("up", Point(500, 200))]
    assert parse_actions(swipe.format(800, 500, 100, 450)) == [Scroll("right", Point(800, 500))]  # finger left
    assert parse_actions(swipe.format(100, 500, 800, 550)) == [Scroll("left", Point(100, 500))]


def test_long_press_time():
    assert parse_actions("long_press(start_box='(1,2)', time='')") == [LongPress(Point(1, 2))]
    assert parse_actions("long_press(start_box='(1,2)', time='1.5')") == [LongPress(Point(1, 2), 1.5)]
    assert (
        format_action(LongPress(Point(1, 2), 2.0)) == "long_press(start_box='<|box_start|>(1,2)<|box_end|>', time='2')"
    )


@pytest.mark.parametrize(
    "text",
    [
        " Thought: go\nAction: wait()",
        "\n\n  Thought: go\nAction: wait()",
        "\ufeffThought: go\nAction: wait()",
        "\ufeff \tThought: go\n  Action: wait()",
        "Reflection: r\n  Action_Summary: s\n\tAction: wait()",
    ],
)
def test_leading_space_a_bom_and_indented_sections(text):
    step = parse_step(text)
    assert step.actions == [Wait()] and (step.thought or step.action_summary) in ("go", "s")


def test_fail_is_an_action_of_its_own():
    assert parse_actions("fail()") == [Fail()]
    assert parse_actions("call_user()") != parse_actions("fail()")  # OSWorld: call_user is not FAIL
    assert action_from_dict(action_to_dict(Fail())) == Fail()


# --- one table: regex, templates and examples derive from it ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_action_types_example_matches_the_regex_and_parses(name):
    pattern = re.compile(proposal_regex(100, 50, names=SPECS))
    example = example_action(name)
    text = f"Thought: an example\nAction: {format_action(example)}"
    assert pattern.fullmatch(text), text
    assert parse_step(text).actions == [example]
    only_this = re.compile(proposal_regex(100, 50, names=[name]))
    assert only_this.fullmatch(text) and not any(
        only_this.fullmatch(f"Thought: x\nAction: {format_action(example_action(other))}")
        for other in SPECS
        if other != name
    )


def test_the_live_templates_are_the_desktop_actions_and_parse_once_filled():
    templates = action_templates()
    assert [t.split("(")[0] for t in templates] == list(COMPUTER_ACTIONS)
    assert templates[0] == "click(start_box='<|box_start|>(x,y)<|box_end|>')"
    for template in templates:
        [action] = parse_actions(template.replace("(x,y)", "(3,4)"))
        assert action.name == template.split("(")[0]


@pytest.mark.skipif(not available(), reason="needs Xvfb, openbox and x11vnc (scripts/bootstrap)")
def test_the_new_forms_run_on_a_real_desktop(tmp_path):
    """ctrl+c style hotkeys press the right keys, hover moves the pointer, fail() ends without touching the screen,
    and every action the live page offers runs on a desktop."""
    desktop = Desktop.start(tmp_path / "home")
    try:
        mapping = ScreenMapping(desktop.width, desktop.height)
        out = desktop.home / "typed.txt"
        command = f'read line; printf %s "$line" > {out}'
        desktop.launch(["xterm", "-geometry", "80x10+0+0", "-e", "sh", "-c", command])
        assert wait_for(lambda: any(cls == "XTerm" for cls, _ in desktop.windows())), "xterm never showed a window"
        desktop.execute(Click(Point(100, 40)))
        time.sleep(0.3)
        for action in parse_actions("type(content='garbage')\n\nhotkey(key='Ctrl+U')\n\ntype(content='ok\\n')"):
            desktop.execute(action, mapping)  # ctrl+u: the terminal's line kill erases "garbage"

        # The shell's redirection creates the file before printf writes to it: wait for the text, not the file.
        def typed() -> str | None:
            return out.read_text() if out.exists() else None

        assert wait_for(lambda: typed() == "ok"), f"the terminal wrote {typed()!r}"
        [hover] = parse_actions("hover(start_box='(300,200)')")
        assert desktop.execute(hover, mapping) == "ok" and desktop.pointer() == mapping.to_screen(300, 200)
        assert desktop.execute(Fail()) == "fail" and desktop.pointer() == mapping.to_screen(300, 200)
        for name in COMPUTER_ACTIONS:
            desktop.execute(example_action(name), mapping)
    finally:
        desktop.stop()
