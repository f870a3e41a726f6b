"""Agreement figures against hand-computed cases and a published Krippendorff example (pure functions, no DB)."""

from __future__ import annotations

import math

import pytest

from annotation_app.agreement import (
    Annotation,
    agreement_of,
    first_step_agrees,
    outcome_agrees,
    rubric_alpha,
    similarity,
    step_tokens,
)

NAN = math.nan


def click(x: float, y: float) -> list[dict]:
    return [{"type": "click", "point": [x, y]}]


def typed(text: str) -> list[dict]:
    return [{"type": "type", "content": text}]


def annotation(pk: int, annotator: int, steps: list[list[dict]], **kw) -> Annotation:
    return Annotation(pk, 1, annotator, kw.pop("width", 1000), kw.pop("height", 1000), steps=steps, **kw)


# Krippendorff (2011), "Computing Krippendorff's alpha-reliability", the 3 coders x 15 units example (also the
# Wikipedia article's): alpha = 0.691 nominal, 0.811 interval.
PUBLISHED = [
    [NAN, NAN, NAN, NAN, NAN, 3, 4, 1, 2, 1, 1, 3, 3, NAN, 3],
    [1, NAN, 2, 1, 3, 3, 4, 3, NAN, NAN, NAN, NAN, NAN, NAN, NAN],
    [NAN, NAN, 2, 1, 3, 4, 4, NAN, 2, 1, 1, 3, 3, NAN, 4],
]


def _triples(matrix):
    return [(str(u), str(c), v) for c, row in enumerate(matrix) for u, v in enumerate(row) if not math.isnan(v)]


@pytest.mark.parametrize(("level", "expected"), [("nominal", 0.691), ("interval", 0.811)])
def test_alpha_matches_the_published_example(level, expected):
    assert rubric_alpha(_triples(PUBLISHED), level=level) == pytest.approx(expected, abs=0.001)


def test_alpha_by_hand():
    # Two reviewers, two trajectories scored 1 and 5 by both: perfect agreement.
    assert rubric_alpha([("a", "r1", 1), ("a", "r2", 1), ("b", "r1", 5), ("b", "r2", 5)]) == pytest.approx(1.0)
    # Nominal, 2 coders x 2 units, values (1,2) and (2,1): D_o = 1 (every pairable pair differs), D_e = 4/6 * ... :
    # counts n1 = n2 = 2, n = 4, D_e = 2*n1*n2/(n(n-1)) = 8/12, alpha = 1 - 1/(8/12) = -0.5.
    assert rubric_alpha([("a", "r1", 1), ("a", "r2", 2), ("b", "r1", 2), ("b", "r2", 1)], "nominal") == -0.5
    assert rubric_alpha([("a", "r1", 3)]) is None  # one reviewer: nothing to agree on
    assert rubric_alpha([("a", "r1", 3), ("a", "r2", 3)]) is None  # one value throughout: undefined


def test_similarity_is_one_minus_normalised_edit_distance():
    save = [{"type": "hotkey", "keys": ["ctrl", "s"]}]
    a = step_tokens([click(10, 10), typed("Hello"), save], 1000, 1000)
    same_targets = step_tokens([click(12, 14), typed("hello "), save], 1000, 1000)
    assert similarity(a, same_targets) == 1.0  # same grid cell, text normalised
    other_click = step_tokens([click(900, 900), typed("hello"), save], 1000, 1000)
    assert similarity(a, other_click) == pytest.approx(1 - 1 / 3)  # one substitution in three
    shorter = step_tokens([click(10, 10)], 1000, 1000)
    assert similarity(a, shorter) == pytest.approx(1 - 2 / 3)  # two deletions, longest is 3
    assert similarity([], []) == 1.0


def test_first_step_points_by_tolerance_and_by_element():
    assert first_step_agrees(click(100, 100), click(120, 110))  # 22 px apart
    assert not first_step_agrees(click(100, 100), click(160, 100))  # 60 px apart
    assert not first_step_agrees(click(100, 100), typed("x"))
    button = (50.0, 50.0, 300.0, 150.0)
    assert first_step_agrees(click(60, 60), click(290, 140), boxes=[button])  # far apart, same button
    inner = (50.0, 50.0, 120.0, 150.0)
    assert not first_step_agrees(click(100, 100), click(125, 100), boxes=[button, inner])  # 25 px, other elements
    # b's screen is half the size: its (60, 60) is a's (120, 120).
    assert first_step_agrees(click(120, 120), click(60, 60), scale=(2.0, 2.0))
    assert not first_step_agrees(typed("abc"), typed("abd"))


def test_outcome_uses_the_verifier_then_the_verdicts():
    a, b = annotation(1, 1, [], outcome=1.0, verdict="reject"), annotation(2, 2, [], outcome=0.8, verdict="approve")
    assert outcome_agrees(a, b) is True
    b.outcome = 0.0
    assert outcome_agrees(a, b) is False
    b.outcome = None
    assert outcome_agrees(a, b) is False  # verdicts differ
    a.verdict = None
    assert outcome_agrees(a, b) is None


def test_task_agreement_by_hand():
    one = annotation(1, 1, [click(100, 100), typed("x")], outcome=1.0)
    two = annotation(2, 2, [click(110, 100), typed("x")], outcome=1.0)
    three = annotation(3, 3, [click(800, 800)], outcome=0.0)
    result = agreement_of([three, one, two])
    assert result["annotators"] == [1, 2, 3]
    # pairs (1,2), (1,3), (2,3): outcome agree, disagree, disagree; first step agree, no, no;
    # similarity 1, 1 - 2/2 = 0, 0.
    assert result["outcome_agreement"] == pytest.approx(1 / 3)
    assert result["first_step_agreement"] == pytest.approx(1 / 3)
    assert result["similarity"] == pytest.approx(1 / 3)
    assert result["agreement"] == pytest.approx(1 / 3)
    assert result["alpha"] is None
    assert agreement_of([one]) is None
