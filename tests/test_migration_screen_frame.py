"""Migration 0007: live steps stored in the model image's frame move to screen pixels (and back on reverse); stored
candidates of every earlier shape take the one shape."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from sandbox.coordinates import ScreenMapping

BEFORE = [("annotation_app", "0006_step_status_and_frame")]
AFTER = [("annotation_app", "0007_steps_in_screen_pixels")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture
def at_0006(transactional_db):
    """The schema before the data migration; put back to the latest afterwards."""
    apps = migrate(BEFORE)
    yield apps
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_live_steps_move_to_screen_pixels_and_candidates_take_the_one_shape(at_0006):
    apps = at_0006
    User, Task = apps.get_model("annotation_app", "User"), apps.get_model("annotation_app", "Task")
    Trajectory, Step = apps.get_model("annotation_app", "Trajectory"), apps.get_model("annotation_app", "Step")
    LiveSession = apps.get_model("annotation_app", "LiveSession")
    user = User.objects.create(username="m1")
    task = Task.objects.create(instruction="t")
    mapping = ScreenMapping(1280, 800)
    model_w, model_h = mapping.model_size  # what the sandbox service told live.py, and what its proposals used
    live = Trajectory.objects.create(
        task=task, annotator=user, mode="interactive", screen_width=1280, screen_height=800
    )
    LiveSession.objects.create(trajectory=live, status="ended", model_width=model_w, model_height=model_h)
    old_click = "drag(start_box='<|box_start|>(644,406)<|box_end|>', end_box='<|box_start|>(1287,811)<|box_end|>')"
    shown = {
        "raw": "Thought: go\nAction: click(start_box='(322,203)')", "thought": "go",
        "action_text": "click(start_box='<|box_start|>(322,203)<|box_end|>')",
        "actions": [{"type": "click", "point": [322, 203]}], "points": [[322, 203]], "error": "", "model": "tiny",
    }  # fmt: skip
    off = {**shown, "action_text": "click(start_box='<|box_start|>(5000,1)<|box_end|>')", "error": "outside"}
    Step.objects.create(
        trajectory=live, index=0, action_text=old_click, source="model", chosen_candidate=0,
        action={"actions": [{"type": "drag", "start": [644, 406], "end": [1287, 811]}]}, candidates=[shown, off],
    )  # fmt: skip
    Step.objects.create(trajectory=live, index=1, action_text="type(content='hi')", action={})
    insitu = Trajectory.objects.create(task=task, annotator=user, mode="in_situ", screen_width=1280, screen_height=800)
    Step.objects.create(
        trajectory=insitu, index=0, action_text="click(start_box='<|box_start|>(644,406)<|box_end|>')",
        candidates=[{"thought": "Alternative.", "action": "click(start_box='(10,20)')"}],
    )  # fmt: skip
    Step.objects.create(trajectory=insitu, index=1, action_text="hotkey(key='ctrl s')", action={"type": "hotkey"})

    apps = migrate(AFTER)
    Step = apps.get_model("annotation_app", "Step")
    first = Step.objects.get(trajectory_id=live.pk, index=0)
    # each point is the screen pixel the sandbox clicked when it ran the model-frame action
    assert mapping.to_screen(644, 406) == (640, 400) and mapping.to_screen(1287, 811) == (1279, 799)
    assert first.action_text == (
        "drag(start_box='<|box_start|>(640,400)<|box_end|>', end_box='<|box_start|>(1279,799)<|box_end|>')"
    )
    assert first.action == {"actions": [{"type": "drag", "start": [640, 400], "end": [1279, 799]}]}
    assert first.candidates[0] == {
        "thought": "go", "action_text": "click(start_box='<|box_start|>(320,200)<|box_end|>')",
        "actions": [{"type": "click", "point": [320, 200]}], "points": [[320, 200]], "raw": shown["raw"],
        "error": "", "model": "tiny",
    }  # fmt: skip
    assert first.candidates[1]["action_text"] == "" and first.candidates[1]["error"] == "outside"
    assert first.candidates[1]["raw"] == shown["raw"]
    assert Step.objects.get(trajectory_id=live.pk, index=1).action == {"actions": [{"type": "type", "content": "hi"}]}
    assert Step.objects.get(trajectory_id=insitu.pk, index=1).action == {
        "actions": [{"type": "hotkey", "keys": ["ctrl", "s"]}]
    }
    other = Step.objects.get(trajectory_id=insitu.pk, index=0)
    assert other.action_text == "click(start_box='<|box_start|>(644,406)<|box_end|>')"  # already screen pixels
    assert other.candidates == [
        {"thought": "Alternative.", "action_text": "click(start_box='<|box_start|>(10,20)<|box_end|>')",
         "actions": [{"type": "click", "point": [10, 20]}], "points": [[10, 20]], "raw": "", "error": "", "model": ""}
    ]  # fmt: skip

    apps = migrate(BEFORE)  # reversible: back to the model frame, within a pixel
    first = apps.get_model("annotation_app", "Step").objects.get(trajectory_id=live.pk, index=0)
    assert first.action["actions"][0]["start"] == [644, 406] and first.action["actions"][0]["end"] == [1287, 811]
