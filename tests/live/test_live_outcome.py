"""A live trajectory that ends gets its outcome: the task's evaluator runs on the desktop before it is released, and
its score (or why there is none) is stored on the trajectory and shown in the session's state."""

from __future__ import annotations

import pytest

from annotation_app.live import sessions as live
from annotation_app.models import Role, Trajectory
from annotation_app.task_queue import next_task

from ..factories import TaskFactory
from ..waiting import wait_for
from .conftest import needs_desktop
from .test_live_flow import proposals_ready

pytestmark = [needs_desktop, pytest.mark.slow]

# A terminal that writes the line typed into it to ~/answer.txt; the evaluator reads the file back.
WRITE_ANSWER = 'read line; printf %s "$line" > "$HOME/answer.txt"; sleep 600'
EVALUATOR = {
    "func": "exact_match",
    "result": {"type": "vm_command_line", "command": "cat $HOME/answer.txt", "shell": True},
    "expected": {"type": "rule", "rules": {"expected": "hello"}},
}


def _session(make_user, evaluator):
    annotator = make_user(Role.ANNOTATOR)
    setup = [{"type": "launch", "parameters": {"command": ["xterm", "-maximized", "-e", "sh", "-c", WRITE_ANSWER]}}]
    task = TaskFactory(instruction="Type hello into the terminal.", setup_config=setup, evaluator=evaluator)
    next_task(annotator)
    session = live.open_live(annotator, task)
    assert wait_for(lambda: proposals_ready(session, 0), timeout=90)
    return session


@pytest.mark.parametrize(("typed", "score"), [("hello", 1.0), ("goodbye", 0.0)])
def test_finishing_runs_the_tasks_evaluator_and_stores_its_score(live_worker, embedded_model, make_user, typed, score):
    session = _session(make_user, EVALUATOR)
    live.take_step(session, expected_index=0, thought="Type it.", action_text=f"type(content='{typed}\\n')")
    live.take_step(session, expected_index=1, thought="Done.", action_text="finished(content='typed it')")
    trajectory = Trajectory.objects.get(pk=session.trajectory_id)
    assert trajectory.outcome_reward == score
    evaluation = trajectory.metadata["evaluation"]
    assert evaluation["status"] == "scored" and evaluation["score"] == score
    assert evaluation["metrics"] == ["exact_match"] and evaluation["last_action"] == "finished"
    session.refresh_from_db()
    assert live.state_of(session)["evaluation"] == evaluation  # the ended live page shows it


def test_a_task_without_an_evaluator_says_so_instead_of_a_silent_null(live_worker, embedded_model, make_user):
    session = _session(make_user, {})
    live.take_step(session, expected_index=0, thought="Done.", action_text="finished(content='')")
    trajectory = Trajectory.objects.get(pk=session.trajectory_id)
    assert trajectory.outcome_reward is None
    assert trajectory.metadata["evaluation"]["status"] == "no_evaluator"
    assert "no evaluator" in trajectory.metadata["evaluation"]["message"]


def test_abandoning_is_not_scored(live_worker, embedded_model, make_user):
    session = _session(make_user, EVALUATOR)
    live.end_live(session, "abandoned")
    trajectory = Trajectory.objects.get(pk=session.trajectory_id)
    assert trajectory.outcome_reward is None and "evaluation" not in trajectory.metadata


def test_proposals_can_be_retried_and_moved_to_the_active_model(live_worker, embedded_model, make_user):
    from flywheel.models import ModelVersion

    session = _session(make_user, {})
    broken = ModelVersion.objects.create(name="broken", checkpoint_uri="/nowhere", endpoint_url="")
    Trajectory.objects.filter(pk=session.trajectory_id).update(model_version=broken)
    live.retry_proposals(session)
    assert wait_for(lambda: live.LiveSession.objects.get(pk=session.pk).proposals == "failed", timeout=60)
    session.refresh_from_db()
    assert "endpoint" in session.proposal_error
    live.retry_proposals(session, switch_to_active=True)
    assert Trajectory.objects.get(pk=session.trajectory_id).model_version_id == embedded_model.pk
    assert wait_for(lambda: proposals_ready(session, 0), timeout=90)
    live.end_live(session, "abandoned")
    with pytest.raises(live.Conflict, match="ended"):
        live.retry_proposals(session)


def test_the_trajectory_page_shows_the_outcome_or_why_there_is_none(client, make_user):
    from ..factories import TrajectoryFactory

    lead = make_user(Role.DATA_LEAD)
    client.force_login(lead)
    scored = TrajectoryFactory(outcome_reward=1.0, metadata={"evaluation": {"status": "scored", "score": 1.0,
                               "metrics": ["exact_match"], "last_action": "finished"}})  # fmt: skip
    none = {"status": "no_evaluator", "message": "This task has no evaluator"}
    bare = TrajectoryFactory(metadata={"evaluation": none})
    body = client.get(f"/trajectories/{scored.pk}/").content.decode()
    assert "1.00" in body and "(success)" in body and "exact_match after finished" in body
    assert "This task has no evaluator" in client.get(f"/trajectories/{bare.pk}/").content.decode()


def test_steps_record_how_long_their_screenshot_waited_and_abandoning_is_a_terminal_status(
    live_worker, embedded_model, make_user
):
    session = _session(make_user, {})
    live.take_step(session, expected_index=0, thought="Type it.", action_text="type(content='hello\\n')")
    live.take_step(session, expected_index=1, thought="Wait.", action_text="wait()")
    first, second = Trajectory.objects.get(pk=session.trajectory_id).steps.order_by("index")
    for step in (first, second):  # the first screenshot waited after the setup, the second after step 0's action
        assert set(step.settle) == {"waited_ms", "timed_out", "redraws"}
        assert 0 <= step.settle["waited_ms"] <= 5000
    assert second.settle["redraws"] >= 1  # typing into the terminal drew something, and the screenshot waited for it
    live.end_live(session, "abandoned")
    assert Trajectory.objects.get(pk=session.trajectory_id).status == Trajectory.Status.ABANDONED
