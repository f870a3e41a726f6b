"""The action grammar: real UI-TARS outputs, errors that say where, and round trips (hypothesis)."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.actions import (
    DIRECTIONS,
    SPECS,
    ActionSyntaxError,
    CallUser,
    Click,
    Drag,
    Finished,
    Hotkey,
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
    action_to_dict,
    format_action,
    format_actions,
    format_step,
    parse_actions,
    parse_step,
)


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
points = st.builds(Point, coordinates, coordinates)
text = st.text(max_size=40)  # any Unicode, quotes, backslashes and newlines included
key = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
STRATEGIES = {
    Click: st.builds(Click, points), LeftDouble: st.builds(LeftDouble, points),
    RightSingle: st.builds(RightSingle, points), LongPress: st.builds(LongPress, points),
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
