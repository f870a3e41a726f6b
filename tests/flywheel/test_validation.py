"""V(s) as a pure function: every route, the configuration, and the grammar fast path's soundness."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.validation import (
    CT,
    HELD,
    SFT,
    Review,
    Signals,
    VConfig,
    action_error,
    canonical,
    structural_problems,
    validate,
)
from sandbox.actions import SPECS, ActionSyntaxError, example_action, format_action, parse_actions

CLICK = "click(start_box='<|box_start|>(10,20)<|box_end|>')"


def signals(**overrides: object) -> Signals:
    base: dict[str, object] = {
        "trajectory_id": 1,
        "mode": "interactive",
        "indices": [0, 1, 2],
        "actions": [CLICK, "type(content='hi\\n')", "finished(content='done')"],
        "with_thought": 3,
    }
    base.update(overrides)
    return Signals(**base)  # type: ignore[arg-type]


CONFIG = VConfig()


def test_verified_and_approved_goes_to_sft():
    verdict = validate(signals(outcome_reward=1.0, review=Review(7, "approve", 5)), CONFIG)
    assert verdict.route == SFT
    assert verdict.v == pytest.approx(1.0)
    assert verdict.reason.startswith("sft: V=1.000 >= 0.8")
    assert verdict.components["verifier"] == {"value": 1.0, "source": "task evaluator (outcome_reward)"}
    assert verdict.components["review"]["source"] == "review 7: approve, score 5"
    assert verdict.threshold == 0.8


def test_a_failed_verifier_goes_to_ct_with_v_below_threshold():
    verdict = validate(signals(outcome_reward=0.0), CONFIG)
    # verifier 0 (w2), structure 1 (w0.5), thoughts 1 (w0.5): V = 1/3
    assert verdict.v == pytest.approx(1 / 3, abs=1e-6)
    assert verdict.route == CT
    assert verdict.reason == "ct: V=0.333 < 0.8"


def test_without_verifier_review_or_orm_it_goes_to_ct_even_with_high_v():
    verdict = validate(signals(), CONFIG)
    assert verdict.v == pytest.approx(1.0)
    assert verdict.route == CT
    assert "no verifier result, review or ORM score" in verdict.reason
    relaxed = VConfig(sft_needs_judgement=False)
    assert validate(signals(), relaxed).route == SFT


def test_a_rejected_review_never_reaches_sft():
    verdict = validate(signals(outcome_reward=1.0, review=Review(3, "reject", None)), VConfig(threshold=0.1))
    assert verdict.route == CT
    assert verdict.reason == "ct: rejected by review 3"
    assert verdict.components["review"]["value"] == 0.0


@pytest.mark.parametrize(
    ("review", "route"),
    [
        (None, CT),
        (Review(1, "approve", None), CT),  # approved but not rated as SFT quality
        (Review(1, "approve", 3), CT),
        (Review(1, "approve", 4), SFT),
        (Review(1, "approve", 5), SFT),
    ],
)
def test_in_situ_thoughts_are_ct_unless_reviewed_as_sft_quality(review, route):
    verdict = validate(signals(mode="in_situ", capture_flags=[], review=review), CONFIG)
    assert verdict.route == route
    if route == CT:
        assert "in-situ thoughts are CT material" in verdict.reason
    assert verdict.components["curation"] == {"value": 1.0, "source": "capture flags: none"}


def test_curation_flags_lower_v():
    clean = validate(signals(mode="in_situ", capture_flags=[], review=Review(1, "approve", 5)), CONFIG)
    duplicate = validate(
        signals(mode="in_situ", capture_flags=["near_duplicate:17", "no_speech"], review=Review(1, "approve", 5)),
        CONFIG,
    )
    assert duplicate.components["curation"]["value"] == 0.0
    assert duplicate.v < clean.v
    assert duplicate.route == CT
    assert validate(signals(capture_flags=["something_new"]), CONFIG).components["curation"]["value"] == 0.5


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"indices": [], "actions": []}, "it has no steps"),
        ({"no_screenshot": [1]}, "step 1 has no screenshot"),
        ({"actions": [CLICK, "clik(start_box='(1,2)')", "wait()"]}, "step 1's action does not parse"),
        ({"indices": [0, 2, 3]}, "not numbered 0..2 in order"),
        ({"unfinished": [2]}, "step 2's result was never recorded"),
    ],
)
def test_only_broken_data_is_held_with_a_reason(overrides, reason):
    verdict = validate(signals(outcome_reward=1.0, review=Review(1, "approve", 5), **overrides), CONFIG)
    assert verdict.route == HELD
    assert verdict.v == 0.0
    assert reason in verdict.reason and verdict.reason.startswith("held: ")
    assert reason in verdict.components["structure"]["source"]


def test_the_orm_slot_counts_when_a_score_is_given():
    verdict = validate(signals(orm=1.0), CONFIG)
    assert verdict.components["orm"] == {"value": 1.0, "source": "generative ORM"}
    assert verdict.route == SFT  # the ORM is a judgement
    low = validate(signals(orm=0.0), CONFIG)
    assert low.v == pytest.approx(0.5) and low.route == CT  # orm 0 (w1), structure and thoughts 1 (w0.5 each)


def test_thoughts_share_is_a_component():
    verdict = validate(signals(outcome_reward=1.0, with_thought=0), CONFIG)
    assert verdict.components["thoughts"]["value"] == 0.0
    assert verdict.v == pytest.approx(2.5 / 3.0)


def test_weights_and_threshold_are_configurable_and_recorded():
    config = VConfig.from_dict({"weights": {"verifier": 0.0}, "threshold": 0.5})
    assert config.weights["review"] == 2.0 and config.weights["verifier"] == 0.0
    verdict = validate(signals(outcome_reward=0.0, review=Review(1, "approve", 1)), config)
    assert "verifier" in verdict.components  # recorded, but weightless
    assert verdict.route == SFT and verdict.threshold == 0.5
    assert VConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"weights": {"vibes": 1}}, "unknown V component"),
        ({"threshold": 2}, "threshold must be a number from 0 to 1"),
        ({"threshold": "high"}, "threshold must be a number"),
        ({"nonsense": 1}, "unknown V setting"),
        ({"weights": [1]}, "weights must be an object"),
        ({"insitu_sft_min_review_score": 9}, "insitu_sft_min_review_score"),
        ({"rejected_never_sft": "yes"}, "rejected_never_sft must be true or false"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(data, message):
    with pytest.raises(ValueError, match=message):
        VConfig.from_dict(data)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_canonical_action_passes_the_structural_check(name):
    text = format_action(example_action(name))
    assert action_error(text) is None
    parse_actions(text)


def test_fast_path_covers_the_common_actions():
    common = [CLICK, "click(start_box='(10,20)')", "hotkey(key='ctrl c')", "type(content='a\\'b\\n')", "wait()"]
    common += ["scroll(start_box='<|box_start|>(1,2)<|box_end|>', direction='down')", CLICK + "\n\nwait()"]
    for text in common:
        assert canonical(text), text


def test_out_of_range_coordinates_fail_the_check():
    assert action_error("click(start_box='(100001,2)')") is not None
    assert not canonical("click(start_box='(123456,2)')")


_FRAGMENTS = st.sampled_from(
    [
        "click", "left_double", "drag", "scroll", "hotkey", "type", "press", "finished", "wait", "fail", "(", ")",
        "start_box=", "end_box=", "direction=", "key=", "content=", "'", "\\", "\\'", "<|box_start|>", "<|box_end|>",
        "(10,20)", "(99999,0)", "(100000,1)", "(-5,3.5)", ",", " ", ", ", "\n\n", "down", "ctrl c", "a b c d", "x",
        "+", "1.0e5", "'down'", "''",
    ]
)  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(st.lists(_FRAGMENTS, min_size=1, max_size=14).map("".join))
def test_fast_path_accepts_only_text_the_parser_accepts(text):
    if canonical(text):
        parse_actions(text)  # raises if the fast path let through something the grammar refuses
    try:
        parse_actions(text)
        parsed = True
    except ActionSyntaxError:
        parsed = False
    assert (action_error(text) is None) == parsed


def test_structural_problems_name_at_most_three():
    many = signals(indices=[0, 5, 6], no_screenshot=[0], unfinished=[1], actions=["x", "y", "z"])
    assert len(structural_problems(many)) == 3


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.lists(_FRAGMENTS, min_size=1, max_size=8).map("".join), min_size=1, max_size=5))
def test_a_trajectory_passes_the_grammar_check_only_when_every_action_parses(texts):
    def parses(text: str) -> bool:
        try:
            parse_actions(text)
        except ActionSyntaxError:
            return False
        return True

    problems = structural_problems(signals(indices=list(range(len(texts))), actions=texts))
    assert (problems == []) == all(parses(t) for t in texts)


def test_steps_are_never_read_across_their_boundary():
    # Each half is broken; joined they would read as one valid call.
    halves = ["type(content='a", "b')"]
    assert structural_problems(signals(indices=[0, 1], actions=halves))
    assert structural_problems(signals(indices=[0], actions=["wait()\x00wait()"]))
    assert structural_problems(signals(indices=[0, 1], actions=["wait()", "type(content='x\\"]))
