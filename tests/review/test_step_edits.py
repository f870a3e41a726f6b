"""Step verdicts, edits, cuts and restores (annotation_app.step_edits) and their endpoints: every edit keeps the
original in the history, the grammar refuses bad actions with a message (400), and the flywheel's export and
validation read the edited steps and leave the cut ones out."""

from __future__ import annotations

import io

import pytest
from django.core.files.storage import default_storage
from django.urls import reverse
from django.utils import timezone

from annotation_app import step_edits
from annotation_app.models import Step, StepEdit, StepVerdict, Task, Trajectory
from annotation_app.trajectories import Conflict, Invalid
from flywheel.iterations import gather, run_iteration, start_iteration
from flywheel.models import Iteration, Validation
from flywheel.validation import CT, SFT, VConfig, validate
from sandbox.actions import parse_step
from training.data import read_episodes

from ..factories import StepFactory, TrajectoryFactory
from ..flywheel.helpers import png

pytestmark = pytest.mark.django_db


def _trajectory(steps: int = 4, **kwargs: object) -> Trajectory:
    trajectory = TrajectoryFactory(
        status=Trajectory.Status.SUBMITTED, screen_width=1280, screen_height=800, submitted_at=timezone.now(), **kwargs
    )
    for i in range(steps):
        StepFactory(
            trajectory=trajectory, index=i, thought=f"Thought {i}.", action_text=f"click(start_box='({10 + i},20)')",
            screenshot=f"trajectories/{trajectory.pk}/steps/{i:05d}.png",
        )  # fmt: skip
    return trajectory


def test_edits_keep_the_original_in_a_history_per_step(lead, make_user):
    other = make_user("data_lead")
    trajectory = _trajectory()
    step = trajectory.steps.get(index=1)
    step_edits.edit_thought(step, lead, "  The   save button is at the top.  ")
    step_edits.edit_action(step, other, "click(start_box='<|box_start|>(300,400)<|box_end|>')")
    step_edits.edit_action(step, lead, "click(start_box='(300,400)')")  # the same action, written otherwise: no edit
    step.refresh_from_db()
    assert step.thought == "The save button is at the top."
    assert step.action_text == "click(start_box='<|box_start|>(300,400)<|box_end|>')"
    assert step.action["actions"] == [{"type": "click", "point": [300, 400]}]
    history = list(step.edits.values_list("field", "before", "after", "editor__username"))
    assert history == [
        ("thought", "Thought 1.", "The save button is at the top.", lead.username),
        (
            "action",
            "click(start_box='(11,20)')",
            "click(start_box='<|box_start|>(300,400)<|box_end|>')",
            other.username,
        ),
    ]
    # The player shows the history with the step.
    shown = step_edits.player_data(trajectory)["steps"][1]
    assert [h["field"] for h in shown["history"]] == ["thought", "action"]
    assert shown["points"] == [[300, 400]] and shown["actions"][0]["type"] == "click"


def test_an_in_situ_step_keeps_its_times_when_its_action_is_edited(lead):
    trajectory = _trajectory(1)
    step = trajectory.steps.get()
    step.action = {"actions": [{"type": "click", "point": [10, 20]}], "t": [1.5, 1.7]}
    step.save()
    step_edits.edit_action(step, lead, "scroll(start_box='(50,60)', direction='down')")
    step.refresh_from_db()
    assert step.action["t"] == [1.5, 1.7] and step.action["actions"][0]["direction"] == "down"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("click(start_box='(10,20)'", "The action does not parse: line 1"),
        ("tap(start_box='(10,20)')", "The action does not parse"),
        ("click(start_box='(5000,20)')", "off the screen"),
        ("   ", "Write an action"),
    ],
)
def test_the_grammar_refuses_a_bad_action_and_nothing_changes(lead, text, message):
    trajectory = _trajectory(1)
    step = trajectory.steps.get()
    with pytest.raises(Invalid, match=message):
        step_edits.edit_action(step, lead, text)
    step.refresh_from_db()
    assert step.action_text == "click(start_box='(10,20)')" and not StepEdit.objects.exists()


def test_the_edit_endpoint_answers_400_with_the_grammars_message(client, lead):
    trajectory = _trajectory(2)
    client.force_login(lead)
    url = reverse("lead-step-edit", args=[trajectory.pk, 1])
    bad = client.post(url, {"field": "action", "value": "click(start_box='(10,'"})
    assert bad.status_code == 400 and bad.json()["detail"].startswith("The action does not parse: line 1, column")
    check = client.post(reverse("lead-step-check", args=[trajectory.pk, 1]), {"action": "drag(start_box='(1,2)')"})
    assert check.status_code == 400 and "end_box" in check.json()["detail"]
    good = client.post(reverse("lead-step-check", args=[trajectory.pk, 1]), {"action": "click(start_box='(7,8)')"})
    assert good.json() == {"actions": [{"type": "click", "point": [7, 8]}]}
    assert client.post(url, {"field": "status", "value": "x"}).status_code == 400
    missing = client.post(reverse("lead-step-edit", args=[trajectory.pk, 9]), {"field": "thought", "value": "x"})
    assert missing.status_code == 404 and "no step 9" in missing.json()["detail"]
    saved = client.post(url, {"field": "action", "value": "hotkey(key='ctrl s')"})
    assert saved.status_code == 200
    (step,) = saved.json()["steps"]
    assert (
        step["action_text"] == "hotkey(key='ctrl s')" and step["history"][0]["before"] == "click(start_box='(11,20)')"
    )


def test_verdicts_one_per_reviewer_and_refusals(lead, make_user):
    trajectory = _trajectory(2)
    step = trajectory.steps.get(index=0)
    step_edits.set_verdict(step, lead, "wrong_action")
    step_edits.set_verdict(step, lead, "ok", "fine after all")
    step_edits.set_verdict(step, make_user("data_lead"), "bad_screenshot")
    assert sorted(step.verdicts.values_list("verdict", flat=True)) == ["bad_screenshot", "ok"]
    with pytest.raises(Invalid, match="not a step verdict"):
        step_edits.set_verdict(step, lead, "great")
    in_progress = _trajectory(1)
    Trajectory.objects.filter(pk=in_progress.pk).update(status=Trajectory.Status.IN_PROGRESS)
    with pytest.raises(Conflict, match="still being recorded"):
        step_edits.edit_thought(in_progress.steps.get(), lead, "x")


def test_cut_and_restore(lead):
    trajectory = _trajectory(5)
    Step.objects.filter(trajectory=trajectory, index=3).update(status=Step.Status.FAILED)
    with pytest.raises(Invalid, match="no step"):
        step_edits.cut(trajectory, lead, 0)
    cut = step_edits.cut(trajectory, lead, 2)
    assert [s.index for s in cut] == [2, 3, 4]
    statuses = dict(trajectory.steps.values_list("index", "status"))
    assert statuses == {0: "done", 1: "done", 2: "cut", 3: "cut", 4: "cut"}
    with pytest.raises(Conflict, match="restore it"):
        step_edits.edit_thought(trajectory.steps.get(index=3), lead, "x")
    with pytest.raises(Conflict, match="Step 2 before it is cut too"):
        step_edits.restore(trajectory, lead, 3)
    step_edits.cut(trajectory, lead, 1)
    step_edits.restore(trajectory, lead, 1)
    statuses = dict(trajectory.steps.values_list("index", "status"))
    assert statuses == {0: "done", 1: "done", 2: "done", 3: "failed", 4: "done"}  # each got its own status back
    assert trajectory.steps.get(index=3).edits.filter(field="status").count() == 2
    with pytest.raises(Invalid, match="nothing to restore"):
        step_edits.restore(trajectory, lead, 1)


def _run_iteration() -> Iteration:
    iteration = start_iteration(None, enqueue=False, config={"v": {"threshold": 0.5}})  # type: ignore[arg-type]
    done = run_iteration(iteration.pk, chunk=7)
    assert done.status == Iteration.Status.SUCCEEDED, done.error
    return done


def test_export_uses_the_edited_action_and_leaves_cut_steps_out(media, lead):
    task = Task.objects.create(instruction="Save the file", domain="chrome")
    trajectory = Trajectory.objects.create(
        task=task, mode=Trajectory.Mode.ROLLOUT, status=Trajectory.Status.SUBMITTED, outcome_reward=1.0,
        screen_width=1280, screen_height=800, submitted_at=timezone.now(),
    )  # fmt: skip
    shot = default_storage.save(f"t/{trajectory.pk}.png", io.BytesIO(png(1280, 800)))
    for i in range(4):
        Step.objects.create(
            trajectory=trajectory, index=i, thought=f"T{i}.", action_text=f"click(start_box='({100 + i},200)')",
            screenshot=shot,
        )  # fmt: skip
    step_edits.edit_action(trajectory.steps.get(index=1), lead, "type(content='hello')")
    step_edits.edit_thought(trajectory.steps.get(index=0), lead, "The edited thought.")
    step_edits.cut(trajectory, lead, 2)
    _run_iteration()
    validation = Validation.objects.get(trajectory=trajectory)
    assert validation.route == SFT, validation.reason  # the cut steps are neither "unfinished" nor exported
    (episode,) = read_episodes(default_storage.path("flywheel/stores/sft"))
    answers = [m["content"] for m in episode.messages if m["role"] == "assistant"]
    assert len(answers) == 2 and episode.turns == 2
    assert parse_step(answers[0]).thought == "The edited thought."
    assert answers[1] == "Thought: T1.\nAction: type(content='hello')"


def test_validation_reads_open_step_verdicts(lead):
    trajectory = _trajectory(3, outcome_reward=1.0)
    wrong = trajectory.steps.get(index=1)
    step_edits.set_verdict(wrong, lead, "wrong_action")
    step_edits.set_verdict(trajectory.steps.get(index=0), lead, "ok")
    rows = [(trajectory.pk, trajectory.mode, 1.0, None, None, None)]
    (signals,) = gather(rows)
    assert list(signals.bad_steps) == [(1, "wrong_action")]
    verdict = validate(signals, VConfig(threshold=0.5))
    assert verdict.route == CT and "step 1 wrong action" in verdict.reason
    assert validate(signals, VConfig(threshold=0.5, flagged_steps_never_sft=False)).route == SFT
    # Editing the action after the verdict answers it; a cut step's verdict is not read either.
    step_edits.edit_action(wrong, lead, "click(start_box='(1,1)')")
    step_edits.set_verdict(trajectory.steps.get(index=2), lead, "wrong_thought")
    assert list(gather(rows)[0].bad_steps) == [(2, "wrong_thought")]
    step_edits.cut(trajectory, lead, 2)
    (signals,) = gather(rows)
    assert list(signals.bad_steps) == [] and list(signals.indices) == [0, 1]
    assert validate(signals, VConfig(threshold=0.5)).route == SFT
    assert StepVerdict.objects.filter(step__trajectory=trajectory).count() == 3


def test_media_answers_byte_ranges_so_the_audio_can_be_seeked(client, lead, media):
    from django.core.files.base import ContentFile

    from annotation_app.models import Recording

    recording = Recording(trajectory=_trajectory(1), audio_content_type="audio/wav")
    recording.audio.save("audio.wav", ContentFile(bytes(range(100))), save=True)
    client.force_login(lead)
    url = recording.audio.url
    whole = client.get(url)
    assert whole.status_code == 200 and whole["Accept-Ranges"] == "bytes"
    assert b"".join(whole.streaming_content) == bytes(range(100))
    part = client.get(url, HTTP_RANGE="bytes=10-19")
    assert part.status_code == 206 and part.content == bytes(range(10, 20))
    assert part["Content-Range"] == "bytes 10-19/100"
    tail = client.get(url, HTTP_RANGE="bytes=-5")
    assert tail.content == bytes(range(95, 100)) and tail["Content-Range"] == "bytes 95-99/100"
    assert client.get(url, HTTP_RANGE="bytes=90-").content == bytes(range(90, 100))
    beyond = client.get(url, HTTP_RANGE="bytes=200-300")
    assert beyond.status_code == 416 and beyond["Content-Range"] == "bytes */100"
