"""fail() in live annotation: the annotator declares the task infeasible (OSWorld's FAIL), which ends the session and
submits the trajectory like finished() and call_user() do."""

from __future__ import annotations

import pytest

from annotation_app.live import sessions as live
from annotation_app.models import Trajectory

from .conftest import needs_desktop
from .test_live_flow import started  # noqa: F401  (the fixture: a live session with its first proposals)

pytestmark = [needs_desktop, pytest.mark.slow]


def test_fail_ends_the_session_and_submits_the_trajectory(started):  # noqa: F811
    _, session = started
    step = live.take_step(session, expected_index=0, thought="This app has no such feature.", action_text="fail()")
    assert step.action == {"actions": [{"type": "fail"}]}
    session.refresh_from_db()
    assert session.status == "ended" and session.end_reason == "fail"
    assert Trajectory.objects.get(pk=session.trajectory_id).status == Trajectory.Status.SUBMITTED
