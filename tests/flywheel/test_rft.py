"""Rejection sampling (flywheel.rft) against the real sandbox service and the embedded policy server on the tiny
vision-language model: rollouts stored as trajectories with steps and screenshots, scored by the task's evaluator,
idempotent reruns, cancellation and crash recovery with no lease left behind. The model is random: nothing here
depends on what it says, only on how its attempts are stored."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.core.files.storage import default_storage

from annotation_app.management.commands.seed_demo import DEMO_TASKS
from annotation_app.models import Step, Task, Trajectory
from flywheel import rft
from flywheel.iterations import Cancelled, gather
from flywheel.models import Iteration, ModelVersion
from flywheel.rft import RFTError, check_rft_config, rollouts_of, run_rft, select_tasks
from flywheel.rft_attempt import request_seed
from flywheel.validation import HELD, VConfig, validate
from sandbox.actions import action_points, parse_actions
from sandbox.client import SessionGoneError
from sandbox.leases import LeaseStore
from training.policy.client import PolicyError

from ..live import conftest as live

# The live tests' fixtures, used here by name: the sandbox service and the embedded policy server on the tiny model.
tiny_checkpoint, policy_url, live_services = live.tiny_checkpoint, live.policy_url, live.live_services
live_settings, embedded_model, needs_desktop = live.live_settings, live.embedded_model, live.needs_desktop

DEMO = {external_id: (domain, instruction, setup, evaluator) for external_id, domain, _d, instruction, setup,
        evaluator in DEMO_TASKS}  # fmt: skip
RUN = {"attempts": 2, "max_steps": 3, "concurrency": 2}


def demo_task(external_id: str, **fields) -> Task:
    domain, instruction, setup, evaluator = DEMO[external_id]
    return Task.objects.create(external_id=external_id, instruction=instruction, domain=domain,
                               setup_config=setup, evaluator=evaluator, **fields)  # fmt: skip


def iteration_for(model: ModelVersion, **rft) -> Iteration:
    return Iteration.objects.create(base_model=model, selected_stages=["rft"], config={"rft": rft},
                                    stages={"rft": {"status": "running", "done": 0, "total": None}})  # fmt: skip


def live_leases(services) -> int:
    """Sessions leased now in the test sandbox service's store."""
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/12")
    try:
        return LeaseStore(client, capacity=10, namespace=services.namespace).live_count()
    finally:
        client.close()


class Progress:
    """A stage's progress callback that records its calls and can cancel once `cancel_when()` holds."""

    def __init__(self, cancel_when=None, stop: type[BaseException] = Cancelled):
        self.calls: list[tuple[int, int | None]] = []
        self.cancel_when, self.stop = cancel_when, stop

    def __call__(self, done: int, total: int | None) -> None:
        self.calls.append((done, total))
        if self.cancel_when is not None and self.cancel_when():
            raise self.stop


# --- configuration and choice of tasks (no services) -------------------------------------------------------------


def test_the_rft_config_gets_its_defaults_and_bad_settings_are_named():
    config = check_rft_config(None)
    assert config["attempts"] == 4 and config["concurrency"] is None and config["tasks"] == []
    assert check_rft_config({"attempts": 2, "domains": [" os ", "os"], "tasks": [3, 1, 3]})["domains"] == ["os"]
    assert check_rft_config({"tasks": [3, 1, 3]})["tasks"] == [1, 3]
    assert config["seed"] is None and check_rft_config({"seed": 7})["seed"] == 7
    for bad, words in [
        ({"attempt": 2}, "unknown RFT setting(s): attempt"),
        ({"attempts": 0}, "rft.attempts must be an integer from 1 to 64"),
        ({"attempts": True}, "rft.attempts"),
        ({"max_steps": "5"}, "rft.max_steps"),
        ({"temperature": 3}, "rft.temperature must be a number from 0 to 2"),
        ({"concurrency": 0}, "rft.concurrency"),
        ({"tasks": ["a"]}, "rft.tasks must be a list of task ids"),
        ({"domains": [""]}, "rft.domains"),
        ({"constrain": "yes"}, "rft.constrain must be true or false"),
        ({"seed": -1}, "rft.seed must be an integer from 0 to 2147483647"),
        ({"seed": "7"}, "rft.seed"),
    ]:
        with pytest.raises(ValueError) as error:
            check_rft_config(bad)
        assert words in str(error.value)


def test_a_seeded_request_depends_on_the_tasks_content_attempt_and_turn_not_its_row():
    task = Task(pk=1, instruction="Click OK", setup_config=[{"type": "launch", "parameters": {"command": ["xterm"]}}])
    again = Task(pk=2, instruction=task.instruction, setup_config=task.setup_config)  # the same task imported again
    other = Task(pk=1, instruction="Click Cancel", setup_config=task.setup_config)
    seed = request_seed(7, task, 0, 0)
    assert request_seed(7, again, 0, 0) == seed and 0 <= seed < 2**31
    assert len({seed, request_seed(8, task, 0, 0), request_seed(7, task, 1, 0), request_seed(7, task, 0, 1),
                request_seed(7, other, 0, 0)}) == 5  # fmt: skip


@pytest.mark.django_db
def test_rft_takes_verifiable_training_tasks_only_and_says_why_a_named_one_is_not():
    train = demo_task("demo2-date")
    heldout = demo_task("demo2-notes", metadata={"split": "heldout"})
    no_evaluator = demo_task("demo2-explore")
    archived = demo_task("demo2-todo", status=Task.Status.ARCHIVED)
    phone = demo_task("demo2-lines", platform=Task.Platform.MOBILE)
    assert select_tasks(check_rft_config({})) == [train]
    assert select_tasks(check_rft_config({"domains": ["terminal"]})) == [train]
    with pytest.raises(RFTError, match="no task to roll out in domain"):
        select_tasks(check_rft_config({"domains": ["mousepad"]}))
    named = [train.pk, heldout.pk, no_evaluator.pk, archived.pk, phone.pk, 999999]
    with pytest.raises(RFTError) as error:
        select_tasks(check_rft_config({"tasks": named}))
    message = str(error.value)
    for words in ["held out for evaluation", "has no evaluator", "is archived", "runs on mobile", "999999: does not"]:
        assert words in message
    assert f"{train.pk}:" not in message


@pytest.mark.django_db
def test_rft_refuses_a_model_without_an_endpoint_and_a_bad_config():
    demo_task("demo2-date")
    unserved = ModelVersion.objects.create(name="unserved", checkpoint_uri="x")
    with pytest.raises(RFTError, match="model 'unserved' has no endpoint URL"):
        run_rft(iteration_for(unserved), Progress())
    with pytest.raises(RFTError, match="the iteration has no base model"):
        run_rft(iteration_for(None), Progress())
    with pytest.raises(RFTError, match=r"config\.rft: unknown RFT setting"):
        run_rft(iteration_for(unserved, tries=3), Progress())


# --- real rollouts -------------------------------------------------------------------------------------------------


@needs_desktop
def test_rft_stores_scored_rollouts_with_steps_and_a_rerun_skips_them(
    transactional_db, media, live_settings, embedded_model
):
    tasks = [demo_task("demo2-date"), demo_task("demo2-notes")]
    iteration = iteration_for(embedded_model, tasks=[t.pk for t in tasks], **RUN)
    progress = Progress()
    output = run_rft(iteration, progress)

    assert progress.calls[0] == (0, 4) and progress.calls[-1] == (4, 4)
    assert output["attempts"] == 4 and output["planned"] == 4 and output["error_count"] == 0
    assert output["successes"] == sum(e["successes"] for e in output["by_task"].values())
    assert {k: v["attempts"] for k, v in output["by_task"].items()} == {str(t.pk): 2 for t in tasks}
    rollouts = list(rollouts_of(iteration).order_by("pk"))
    assert len(rollouts) == 4
    assert {(t.task_id, t.metadata["rft"]["attempt"]) for t in rollouts} == {(t.pk, k) for t in tasks for k in (0, 1)}
    for trajectory in rollouts:
        assert trajectory.mode == Trajectory.Mode.ROLLOUT and trajectory.status == Trajectory.Status.SUBMITTED
        assert trajectory.annotator is None and trajectory.metadata["origin"] == "rft"
        assert trajectory.metadata["rft"]["model"] == embedded_model.name
        assert trajectory.model_version == embedded_model and trajectory.submitted_at is not None
        evaluation = trajectory.metadata["evaluation"]  # scored by the task's evaluator, as the live path records
        if evaluation["status"] == "scored":
            assert evaluation["metrics"] == ["exact_match"]
            assert trajectory.outcome_reward in (0.0, 1.0) and evaluation["score"] == trajectory.outcome_reward
        else:  # a random action may end the desktop itself: the record says so, and there is no score
            assert evaluation["status"] == "error" and trajectory.outcome_reward is None
            assert "lost" in evaluation["message"] or "could not run" in evaluation["message"]
        width, height = trajectory.metadata["model_size"]
        assert (trajectory.screen_width, trajectory.screen_height) != (0, 0) and width > 0 and height > 0
        steps = list(trajectory.steps.order_by("index"))
        assert steps and [s.index for s in steps] == list(range(len(steps)))
        assert trajectory.metadata["rft"]["steps"] == len(steps)
        for step in steps:
            assert step.source == Step.Source.MODEL and step.model_version == embedded_model
            assert step.screenshot and default_storage.exists(step.screenshot.name) and step.screenshot_sha256
            assert step.finished_at is not None and step.model_latency_ms is not None
            for action in parse_actions(step.action_text):  # constrained: it parses; stored in screen pixels
                for point in action_points(action):
                    assert 0 <= point.x < trajectory.screen_width and 0 <= point.y < trajectory.screen_height
    assert live_leases(live_settings) == 0

    rows = [(t.pk, t.mode, t.outcome_reward, None, None, None) for t in rollouts]
    for signals in gather(rows):  # validation takes them like any trajectory: only a refused step holds one back
        verdict = validate(signals, VConfig())
        if signals.outcome_reward is not None:
            assert "verifier" in verdict.components or verdict.route == HELD
        if not signals.unfinished:
            assert verdict.route != HELD, verdict.reason

    again = Progress()
    rerun = run_rft(iteration, again)
    assert again.calls == [(4, 4)] and rerun["skipped"] == 4 and rerun["attempts"] == 4
    assert rollouts_of(iteration).count() == 4 and live_leases(live_settings) == 0


@needs_desktop
@pytest.mark.parametrize("stop", [Cancelled, KeyboardInterrupt], ids=["cancel", "ctrl-c"])
def test_a_cancel_mid_run_releases_every_session_and_the_rerun_finishes(
    transactional_db, media, live_settings, embedded_model, stop, monkeypatch
):
    tasks = [demo_task("demo2-date"), demo_task("demo2-notes")]
    iteration = iteration_for(embedded_model, tasks=[t.pk for t in tasks], attempts=1, max_steps=4)
    # Cancel as soon as an attempt has begun (its row exists: it is leasing or setting up its desktop), looked at
    # every 50 ms. Waiting for its first step was a race: a tiny model that says finished() at once let both attempts
    # end before the cancel was looked at, and nothing was left to stop.
    monkeypatch.setattr(rft, "PROGRESS_EVERY_S", 0.05)
    begun = Trajectory.objects.filter(mode=Trajectory.Mode.ROLLOUT, status=Trajectory.Status.IN_PROGRESS)
    started = Progress(cancel_when=begun.exists, stop=stop)
    with pytest.raises(stop):
        run_rft(iteration, started)
    assert live_leases(live_settings) == 0
    assert not rollouts_of(iteration).filter(status=Trajectory.Status.IN_PROGRESS).exists()
    stopped = rollouts_of(iteration).filter(status=Trajectory.Status.ABANDONED)
    assert stopped.exists() and {t.metadata["end_reason"] for t in stopped} == {"cancelled"}

    output = run_rft(iteration, Progress())
    assert output["attempts"] == 2 and output["error_count"] == 0
    finished = rollouts_of(iteration).filter(status=Trajectory.Status.SUBMITTED)
    assert sorted(t.task_id for t in finished) == sorted(t.pk for t in tasks)
    assert live_leases(live_settings) == 0


@needs_desktop
def test_attempts_beyond_the_free_capacity_wait_for_a_session_instead_of_failing(
    transactional_db, media, live_settings, embedded_model
):
    """Someone else holds all but one of the service's sessions: two attempts at once take turns on the last one."""
    tasks = [demo_task("demo2-date"), demo_task("demo2-notes")]
    iteration = iteration_for(embedded_model, tasks=[t.pk for t in tasks], attempts=1, max_steps=2, concurrency=2)
    client = redis.Redis.from_url(f"{settings.REDIS_URL}/12")
    store = LeaseStore(client, capacity=10, namespace=live_settings.namespace)
    held = [store.acquire("someone-else", ttl_s=600) for _ in range(9)]
    try:
        output = run_rft(iteration, Progress())
    finally:
        for lease in held:
            store.release(lease.session_id, "someone-else")
        client.close()
    assert output["attempts"] == 2 and output["error_count"] == 0
    assert live_leases(live_settings) == 0


@needs_desktop
def test_an_attempt_a_crash_left_half_written_is_abandoned_its_lease_released_and_redone(
    transactional_db, media, live_settings, embedded_model
):
    from annotation_app.live.sessions import sandbox_as

    task = demo_task("demo2-date")
    iteration = iteration_for(embedded_model, tasks=[task.pk], attempts=1, max_steps=2)
    crashed = Trajectory.objects.create(
        task=task, mode=Trajectory.Mode.ROLLOUT, model_version=embedded_model,
        metadata={"origin": "rft", "rft": {"iteration": iteration.pk, "attempt": 0, "model": embedded_model.name}},
    )  # fmt: skip
    client = sandbox_as(f"trajectory:{crashed.pk}")
    session = client.allocate(ttl_s=600)["session_id"]  # the crashed worker's lease, still held
    crashed.metadata["rft"]["session"] = session
    crashed.save(update_fields=["metadata"])
    Step.objects.create(trajectory=crashed, index=0, action_text="wait()", source=Step.Source.MODEL)

    output = run_rft(iteration, Progress())
    assert output["redone"] == 1 and output["attempts"] == 1 and output["skipped"] == 0
    crashed.refresh_from_db()
    assert crashed.status == Trajectory.Status.ABANDONED and "interrupted" in crashed.metadata["end_reason"]
    with pytest.raises(SessionGoneError):
        client.renew(session)
    client.close()
    redone = rollouts_of(iteration).get(status=Trajectory.Status.SUBMITTED)
    assert redone.pk != crashed.pk and redone.metadata["rft"]["attempt"] == 0 and redone.steps.exists()
    assert live_leases(live_settings) == 0


@needs_desktop
def test_every_attempt_failing_fails_the_stage_with_the_first_error(
    transactional_db, media, live_settings, embedded_model
):
    """A policy server that does not answer: each attempt is abandoned with its lease released, and the stage fails
    with a message that says why (no silent empty output)."""
    demo_task("demo2-date")
    ModelVersion.objects.filter(pk=embedded_model.pk).update(endpoint_url="http://127.0.0.1:9/v1")
    embedded_model.refresh_from_db()
    iteration = iteration_for(embedded_model, attempts=1, max_steps=2)
    with pytest.raises(RFTError, match="every attempt failed") as error:
        run_rft(iteration, Progress())
    assert PolicyError.__name__ in str(error.value)
    assert rollouts_of(iteration).get().status == Trajectory.Status.ABANDONED
    assert live_leases(live_settings) == 0


def test_browser_attempts_hand_their_sessions_on_instead_of_starting_a_browser_each(
    transactional_db, media, live_settings, embedded_model
):
    """Browser tasks: the run keeps its sessions (one per attempt in flight at most) and resets each for the next
    attempt; every attempt still starts on its own task's page and is scored by that page's verifier, and no session
    is left leased when the stage ends."""
    import json

    from annotation_app.task_import import import_tasks
    from sandbox.suite import suite_tasks

    rows = suite_tasks(["click-button"], train=3, heldout=0, levels=[1])
    import_tasks("\n".join(json.dumps(row) for row in rows).encode(), "suite.jsonl")
    tasks = list(Task.objects.filter(domain="suite-click-button"))
    iteration = iteration_for(embedded_model, tasks=[t.pk for t in tasks], attempts=2, max_steps=2, concurrency=2)
    output = run_rft(iteration, Progress())
    assert output["attempts"] == 6 and output["error_count"] == 0
    sessions = output["browser_sessions"]
    assert sessions["attempts"] == 6 and 1 <= sessions["leased"] <= 2, sessions
    for trajectory in rollouts_of(iteration).select_related("task"):
        assert trajectory.metadata["evaluation"]["status"] == "scored", trajectory.metadata["evaluation"]
        assert trajectory.metadata["kind"] == "browser" and "session" not in trajectory.metadata["rft"]
        label = trajectory.task.instruction.split("'")[1]  # "Click the button labelled 'X'."
        first = trajectory.steps.order_by("index").first()
        assert label in [element["text"] for element in first.outline], first.outline
    assert live_leases(live_settings) == 0


@pytest.mark.django_db
def test_a_reply_with_nul_is_stored_with_replacement_characters(media):
    """Free decoding (`constrain: false`) can write NUL, which PostgreSQL's text and jsonb refuse: the step is stored
    with U+FFFD in its place, and the trajectory keeps its step instead of failing the attempt."""
    from flywheel.rft_attempt import StepRecorder
    from training.envs import Feedback

    task = demo_task("demo2-date")
    trajectory = Trajectory.objects.create(task=task, mode=Trajectory.Mode.ROLLOUT, simulated=True)
    recorder = StepRecorder(trajectory, client=None, model_id=None)  # type: ignore[arg-type]
    recorder.record("Thought: odd\x00 bytes\nAction: nonsense(\x00)", Feedback(None, 0.0, False, {}), b"jpeg", {})
    (step,) = Step.objects.filter(trajectory=trajectory)
    assert step.thought == "odd\ufffd bytes" and step.action_text == "nonsense(\ufffd)"
    assert "\x00" not in step.thought + step.action_text and recorder.problems
