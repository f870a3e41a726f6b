"""Executability verification on the real sandbox service (its own process, isolated sessions, Chromium): a
live-style trajectory of a suite task (recorded once here: the screen before each action, the oracle's actions in
screen pixels) replays and passes through a real Celery worker on the sandbox queue; a tampered screenshot is a
divergent step; an action that no longer reaches its target, or one the sandbox refuses, is not executable; the
session is released on every path; an unreachable sandbox is an error that leaves the flags alone."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

import pytest
from django.core.files.base import ContentFile
from django.test import Client
from django.urls import reverse

from annotation_app.curation.models import VerificationRun
from annotation_app.curation.verify import VERIFY_TASK, run_verification, start_verification
from annotation_app.models import Role, Step, Task, Trajectory
from sandbox.client import SandboxClient, SessionGoneError
from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.suite import make_task, seeds
from sandbox.suite.run import oracle_step

from ..conftest import celery_worker
from ..factories import UserFactory
from ..servers import sandbox_service
from ..waiting import wait_for
from .helpers import flags_of, inverted

pytestmark = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)
API_KEY = "curation-key-" + uuid.uuid4().hex
SANDBOX_REDIS_DB = 29


@dataclass(frozen=True)
class Recording:
    """A played task: its platform task, the screen size and each step's (action in screen pixels, screen before)."""

    task: dict
    width: int
    height: int
    steps: list[tuple[str, bytes]]
    score: float


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root, logs = tmp_path_factory.mktemp("sessions"), tmp_path_factory.mktemp("logs")
    with sandbox_service(root, logs, API_KEY, redis_db=SANDBOX_REDIS_DB) as url:
        yield url


@pytest.fixture(scope="module")
def recording(service) -> Recording:
    """The click-button task played once as a live session records it (observation, then the action)."""
    task = make_task("click-button", seeds("train", 1)[0], "train", 1)
    client = SandboxClient(service, API_KEY, owner="curation-test-recorder")
    info = client.allocate(ttl_s=120, kind=task["platform"])
    sid = info["session_id"]
    steps = []
    try:
        client.setup(sid, task["config"])
        for _ in range(5):
            before = client.observe(sid)
            action, _ = oracle_step(client, sid, task)
            steps.append((action, before))
            if action.startswith("finished("):
                break
        score = client.evaluate(sid, task["evaluator"], last_action="finished")
    finally:
        client.release(sid)
        client.close()
    assert score == 1.0 and steps[-1][0].startswith("finished("), steps
    return Recording(task, info["screen_width"], info["screen_height"], steps, score)


@pytest.fixture
def sandbox_settings(settings, service, media):
    settings.SANDBOX_URL, settings.SANDBOX_API_KEY = service, API_KEY
    return settings


def stored(recording: Recording, *, action: dict[int, str] | None = None, shot: dict[int, bytes] | None = None):
    """The recording as a submitted interactive trajectory, with some steps' actions or screenshots replaced."""
    spec = recording.task
    task = Task.objects.create(
        instruction=spec["instruction"], platform=spec["platform"], setup_config=spec["config"],
        evaluator=spec["evaluator"], domain=spec["domain"],
    )  # fmt: skip
    trajectory = Trajectory.objects.create(
        task=task, annotator=UserFactory(), mode=Trajectory.Mode.INTERACTIVE, status=Trajectory.Status.SUBMITTED,
        screen_width=recording.width, screen_height=recording.height, outcome_reward=recording.score,
        metadata={"kind": spec["platform"]},
    )  # fmt: skip
    for index, (text, before) in enumerate(recording.steps):
        text, before = (action or {}).get(index, text), (shot or {}).get(index, before)
        step = Step(trajectory=trajectory, index=index, action_text=text, thought="t",
                    screenshot_sha256=hashlib.sha256(before).hexdigest())  # fmt: skip
        step.screenshot.save("step.jpg", ContentFile(before), save=False)
        step.save()
    return trajectory


def released(service: str, run: VerificationRun) -> bool:
    client = SandboxClient(service, API_KEY, owner=f"curation:{run.pk}")
    try:
        client.renew(run.session_id, 60)
    except SessionGoneError:
        return True
    finally:
        client.close()
    return False


def verified(trajectory: Trajectory) -> VerificationRun:
    runs, problems = start_verification([trajectory.pk], enqueue=False)
    assert problems == [] and len(runs) == 1
    return run_verification(runs[0].pk)


@pytest.mark.slow
def test_a_replay_through_the_sandbox_queue_passes(transactional_db, sandbox_settings, recording, service, tmp_path,
                                                   make_user):  # fmt: skip
    trajectory = stored(recording)
    lead = make_user(Role.DATA_LEAD)
    with celery_worker(tmp_path / "worker.log", SANDBOX_URL=service, SANDBOX_API_KEY=API_KEY):
        client = Client()
        client.force_login(lead)
        response = client.post(reverse("curation-verify"), {"ids": f"{trajectory.pk}"}, HTTP_HX_REQUEST="true")
        assert response.status_code == 200, response.content
        run = VerificationRun.objects.get(trajectory=trajectory)
        assert wait_for(lambda: not VerificationRun.objects.get(pk=run.pk).active, timeout=240), (
            tmp_path / "worker.log"
        ).read_text()[-3000:]
    run.refresh_from_db()
    assert run.status == VerificationRun.Status.PASSED, run.errors
    assert run.executable is True and run.evaluator_score == 1.0 and run.divergent_steps == []
    assert [d["index"] for d in run.distances] == list(range(len(recording.steps)))
    assert all(d["distance"] <= run.threshold for d in run.distances)
    assert {"allocate_ms", "setup_ms", "steps_ms", "evaluate_ms", "total_ms"} <= set(run.timings)
    assert flags_of(trajectory, "not_executable") == [] and flags_of(trajectory, "divergent_steps") == []
    assert released(service, run)
    assert VERIFY_TASK.startswith("sandbox.")  # routed to the sandbox queue (tests/test_celery_worker.py)


def test_a_tampered_screenshot_is_a_divergent_step(db, sandbox_settings, recording, service):
    trajectory = stored(recording, shot={0: inverted(recording.steps[0][1])})
    run = verified(trajectory)
    assert run.status == VerificationRun.Status.FLAGGED, run.errors
    assert run.divergent_steps == [0] and run.executable is True and run.evaluator_score == 1.0
    (flag,) = flags_of(trajectory, "divergent_steps")
    assert flag["steps"] == [0] and flag["run"] == run.pk
    assert flags_of(trajectory, "not_executable") == []
    assert released(service, run)


def test_an_action_that_no_longer_reaches_its_target_is_not_executable(db, sandbox_settings, recording, service):
    trajectory = stored(recording, action={0: "click(start_box='(3,3)')"})  # the page's corner: no button there
    run = verified(trajectory)
    assert run.status == VerificationRun.Status.FLAGGED and run.executable is False
    assert run.evaluator_score == 0.0 and run.expected_score == 1.0
    (flag,) = flags_of(trajectory, "not_executable")
    assert "evaluator" in flag["detail"]
    assert released(service, run)
    # The trajectory repaired and verified again: the latest run's flags replace the earlier ones.
    Step.objects.filter(trajectory=trajectory, index=0).update(action_text=recording.steps[0][0])
    again = verified(trajectory)
    assert again.status == VerificationRun.Status.PASSED and flags_of(trajectory, "not_executable") == []


def test_a_refused_action_fails_the_replay_and_releases_the_session(db, sandbox_settings, recording, service):
    trajectory = stored(recording, action={0: "press_home()"})  # a phone's action: a browser session refuses it
    run = verified(trajectory)
    assert run.status == VerificationRun.Status.FLAGGED and run.executable is False
    assert "refused" in run.errors[0] and run.evaluator_score is None
    assert flags_of(trajectory, "not_executable")[0]["run"] == run.pk
    assert run.session_id and released(service, run)


def test_an_unreachable_sandbox_is_an_error_that_leaves_the_flags(db, settings, media, recording):
    trajectory = stored(recording)
    trajectory.flags = [{"kind": "not_executable", "detail": "earlier run", "run": 0}]
    trajectory.save()
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # discard port: nothing answers
    run = verified(trajectory)
    assert run.status == VerificationRun.Status.ERROR and run.executable is None
    assert "No sandbox session" in run.errors[0]
    assert flags_of(trajectory, "not_executable")[0]["detail"] == "earlier run"
    assert run_verification(run.pk).status == VerificationRun.Status.ERROR  # idempotent: not run again


def test_what_cannot_be_verified_is_refused_with_a_reason(db, media, recording):
    trajectory = stored(recording)
    in_progress = stored(recording)
    in_progress.status = Trajectory.Status.IN_PROGRESS
    in_progress.save()
    runs, problems = start_verification([trajectory.pk, in_progress.pk, 999999], enqueue=False)
    assert [r.trajectory_id for r in runs] == [trajectory.pk]
    assert problems == [f"Trajectory {in_progress.pk} is in progress: only finished ones.",
                        "Trajectory 999999 does not exist."]  # fmt: skip
    assert start_verification([trajectory.pk], enqueue=False)[1] == [
        f"Trajectory {trajectory.pk} is already being verified."
    ]
