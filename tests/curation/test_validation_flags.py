"""The flywheel's V reads curation flags: not executable or divergent never reaches SFT, a near duplicate reaches it
only as its group's kept trajectory; `gather` takes the flags from Trajectory.flags."""

from __future__ import annotations

import pytest

from annotation_app.models import Trajectory
from flywheel.iterations import _trajectory_rows, gather
from flywheel.validation import CT, SFT, Signals, VConfig, trajectory_flag_names, validate

from ..factories import StepFactory, TrajectoryFactory

CLICK = "click(start_box='<|box_start|>(10,20)<|box_end|>')"


def signals(**overrides: object) -> Signals:
    base: dict[str, object] = {"trajectory_id": 1, "mode": "interactive", "indices": [0, 1],
                               "actions": [CLICK, "finished(content='done')"], "with_thought": 2,
                               "outcome_reward": 1.0}  # fmt: skip
    return Signals(**{**base, **overrides})  # type: ignore[arg-type]


def test_flag_names_distinguish_the_kept_duplicate():
    flags = [
        {"kind": "not_executable", "detail": "x"},
        {"kind": "near_duplicate", "group": 7, "keep": False, "of": 3},
        {"kind": "near_duplicate", "group": 8, "keep": True, "of": 1},
        "junk",
    ]
    assert trajectory_flag_names(flags) == ["not_executable", "near_duplicate:7", "near_duplicate_kept:8"]
    assert trajectory_flag_names(None) == []


@pytest.mark.parametrize(
    ("flags", "route", "reason"),
    [
        ([], SFT, "sft:"),
        (["near_duplicate_kept:3"], SFT, "sft:"),
        (["not_executable"], CT, "ct: curation flagged it (not_executable)"),
        (["divergent_steps"], CT, "ct: curation flagged it (divergent_steps)"),
        (["near_duplicate:3"], CT, "ct: curation flagged it (near_duplicate:3)"),
    ],
)
def test_curation_flags_route(flags, route, reason):
    verdict = validate(signals(curation_flags=flags), VConfig())
    assert verdict.route == route and verdict.reason.startswith(reason)
    if flags:
        assert verdict.components["curation"]["source"] == "curation flags: " + ", ".join(flags)


def test_the_rule_can_be_turned_off_but_the_component_still_counts():
    config = VConfig.from_dict({"curation_never_sft": False, "threshold": 0.5})
    verdict = validate(signals(curation_flags=["divergent_steps"]), config)
    assert verdict.route == SFT and verdict.components["curation"]["value"] == 0.5
    assert validate(signals(), config).v > verdict.v
    with pytest.raises(ValueError, match="curation_never_sft must be true or false"):
        VConfig.from_dict({"curation_never_sft": "yes"})


@pytest.mark.django_db
def test_gather_reads_the_trajectory_flags():
    flagged = TrajectoryFactory(status=Trajectory.Status.SUBMITTED,
                                flags=[{"kind": "near_duplicate", "group": 4, "keep": False, "of": 1}])  # fmt: skip
    plain = TrajectoryFactory(status=Trajectory.Status.SUBMITTED)
    for t in (flagged, plain):
        StepFactory(trajectory=t, index=0)
    rows = _trajectory_rows(Trajectory.objects.filter(pk__in=[flagged.pk, plain.pk]), 0, 10)
    by_id = {s.trajectory_id: s for s in gather(rows)}
    assert list(by_id[flagged.pk].curation_flags) == ["near_duplicate:4"]
    assert list(by_id[plain.pk].curation_flags) == []
