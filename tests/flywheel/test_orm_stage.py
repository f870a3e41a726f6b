"""The validation stage with the generative ORM on: it asks the judge about trajectories with no verifier result,
and its score (or an unparseable answer, never read as a pass) shows in V, the route and the stage's output."""

from __future__ import annotations

import pytest

from flywheel.iterations import start_iteration, validate_and_route
from flywheel.models import Stage, Validation

from .test_orm import fixed, trajectory  # noqa: F401  (fixed is a fixture)

pytestmark = pytest.mark.django_db


def test_the_stage_asks_the_orm_and_records_its_components(fixed):  # noqa: F811
    with fixed({"a": "Score: 0.9", "b": "blah", "c": "Score: 0.1"}) as server:
        for name in "abc":
            trajectory(name)
        trajectory("v", reward=1.0)
        iteration = start_iteration(
            None,
            enqueue=False,
            stages=[Stage.VALIDATE],
            config={"orm": {"enabled": True, "url": server.url, "model": "judge", "api_key_env": "ORM_TEST_KEY"}},
        )
        output = validate_and_route(iteration, chunk=2)
    rows = {v.trajectory.task.instruction: v for v in Validation.objects.filter(iteration=iteration)}
    assert rows["a"].route == "sft" and rows["a"].components["orm"]["value"] == 0.9
    assert rows["b"].route == "ct" and rows["b"].components["orm"] == {"value": None, "source": "unparseable: blah"}
    assert rows["c"].route == "ct"
    assert "orm" not in rows["v"].components  # a verifier result: the judge is not asked
    assert len(server.requests) == 3
    assert output["orm"] == {"asked": 3, "unscored": 1}


def test_without_the_orm_no_judge_is_asked_and_the_output_has_no_orm_counts():
    trajectory("a")
    iteration = start_iteration(None, enqueue=False, stages=[Stage.VALIDATE])
    output = validate_and_route(iteration)
    assert "orm" not in output
    assert "orm" not in Validation.objects.get(iteration=iteration).components
