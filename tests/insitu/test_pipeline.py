"""Captures through the real pipeline: upload → real Celery worker (asr queue) → Whisper → reduction → alignment →
trajectory; the timeline page and API; bad material ends in a clear, recoverable state."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from annotation_app.insitu import pipeline
from annotation_app.models import Capture, Step, Trajectory

from .captures import SCRIPT_WER, CaptureBuilder, scripted, upload, wer

pytestmark = pytest.mark.slow

TIME_SLACK = 1.0  # seconds a word's time may lie outside its sentence (VAD padding, Whisper's word timing)


def wait_processed(pk: int, timeout: float = 120) -> Capture:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        capture = Capture.objects.get(pk=pk)
        if capture.status in ("ready", "failed"):
            return capture
        time.sleep(0.3)
    raise AssertionError(f"capture {pk} still {capture.status} ({capture.stage}) after {timeout} s")


def test_the_capture_task_is_registered_on_the_asr_queue():
    from annotation_app.celery import app

    assert "annotation_app.asr.process_capture" in app.tasks
    assert app.amqp.router.route({}, "annotation_app.asr.process_capture")["queue"].name == "asr"


def test_a_spoken_session_becomes_an_aligned_trajectory_through_a_real_worker(api, annotator, worker, tmp_path):
    builder = scripted(tmp_path)
    state = upload(api, builder.archive(), builder.session_id, chunk=50_000, instruction=builder.instruction)
    assert state["status"] == "queued"
    capture = wait_processed(state["id"])
    assert capture.status == "ready", (capture.error, worker.read_text()[-3000:])
    steps = list(Step.objects.filter(trajectory=capture.trajectory).order_by("index"))
    assert [s.action_text.split("(")[0] for s in steps] == ["click", "type", "finished"]
    assert steps[1].action_text == "type(content='Report')"
    # Each step's thought is its sentence, as well as tiny.en hears it (the exact words differ between CPUs) ...
    for step, phrase in zip(steps, builder.phrases, strict=True):
        assert wer(phrase.text, step.thought) <= SCRIPT_WER, (phrase.text, step.thought)
    # ... and every word went to its step by time: said while its sentence was spoken, before the step's action
    # and after the action before it.
    starts = [step.action["t"][0] for step in steps[:2]] + [float("inf")]
    previous_ends = [0.0] + [step.action["t"][1] for step in steps[:2]]
    for aligned, phrase, action_start, previous_end in zip(
        capture.alignment, builder.phrases, starts, previous_ends, strict=True
    ):
        assert aligned["words"], phrase.text
        for word in aligned["words"]:
            middle = (word["start"] + word["end"]) / 2
            assert phrase.start - TIME_SLACK <= middle <= phrase.end + TIME_SLACK, (word, phrase.start, phrase.end)
            assert previous_end < middle <= action_start, (word, previous_end, action_start)
    assert steps[0].screenshot and steps[1].screenshot  # key frames
    trajectory = capture.trajectory
    assert trajectory.mode == Trajectory.Mode.IN_SITU and (trajectory.screen_width, trajectory.screen_height) == (
        640,
        400,
    )
    assert trajectory.task.instruction == builder.instruction  # free-form: a task of the annotator's own
    recording = trajectory.recordings.get()
    assert recording.audio and recording.event_count == len(builder.events) and recording.transcript
    assert capture.alignment[0]["raw"] == steps[0].thought  # raw transcript kept beside the (editable) thought
    assert capture.progress == 1.0 and capture.stage == "ready" and capture.flags == []

    # the timeline: page, API, editing and submitting
    api.force_login(annotator)
    page = api.get(reverse("insitu-capture-page", args=[capture.pk]))
    assert page.status_code == 200 and b'class="word"' in page.content and b"capture-audio" in page.content
    assert b'</span> <span class="word"' in page.content  # words keep a space between them ("First,Iopen…" before)
    timeline = api.get(reverse("insitu-capture", args=[capture.pk])).json()
    assert [s["index"] for s in timeline["steps"]] == [0, 1, 2] and timeline["steps"][0]["words"]
    url = reverse("insitu-thought", args=[capture.pk, 0])
    assert api.put(url, {"thought": "Open the File menu to find Rename."}, format="json").status_code == 200
    assert api.put(reverse("insitu-thought", args=[capture.pk, 9]), {"thought": "x"}, format="json").status_code == 400
    assert api.post(reverse("insitu-submit", args=[capture.pk])).json()["status"] == "submitted"
    trajectory.refresh_from_db()
    assert trajectory.status == "submitted" and trajectory.steps.get(index=0).thought.startswith("Open the File")
    assert api.put(url, {"thought": "late"}, format="json").status_code == 409  # read-only once submitted

    # the same session recorded again is flagged as a near duplicate of the first
    again = scripted(tmp_path)
    state = upload(api, again.archive(), again.session_id, instruction=again.instruction)
    second = wait_processed(state["id"])
    assert second.status == "ready" and f"near_duplicate:{capture.pk}" in second.flags


def run_inline(api, builder: CaptureBuilder, **archive) -> Capture:
    """Upload, then run the pipeline in this process (the worker path is covered above)."""
    state = upload(api, builder.archive(**archive), builder.session_id, instruction=builder.instruction)
    return pipeline.process(state["id"])


@pytest.mark.django_db(transaction=True)
def test_corrupt_audio_keeps_the_actions_and_says_so(api, media, tmp_path):
    capture = run_inline(api, scripted(tmp_path), audio=b"RIFF\x00\x00\x00\x00WAVEgarbage" * 10)
    assert capture.status == "ready"
    assert any("audio could not be used" in w for w in capture.warnings), capture.warnings
    assert "no_speech" in capture.flags and capture.trajectory.steps.count() == 3


@pytest.mark.django_db(transaction=True)
def test_no_actions_fails_with_a_message_and_can_be_retried(api, media, tmp_path):
    b = CaptureBuilder(tmp_path)
    b.event(0.5, "move", x=1, y=1)
    capture = run_inline(api, b)
    assert capture.status == "failed" and "nothing was done on screen" in capture.error
    pipeline.requeue(capture)  # recoverable: the archive is kept and can be processed again
    assert Capture.objects.get(pk=capture.pk).status == "queued"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("session", "message"),
    [
        ({"format": 7}, "format 7 is not supported"),
        ({"screen": {"width": 0, "height": 10}}, "screen must give width and height"),
        ({"audio": {"file": "audio.wav", "offset": "soon"}}, "audio.offset must be seconds"),
    ],
)
def test_bad_session_json_fails_clearly(api, media, tmp_path, session, message):
    b = CaptureBuilder(tmp_path)
    b.click(1.0, 10, 10)
    capture = run_inline(api, b, audio=None, session=session)
    assert capture.status == "failed" and message in capture.error


@pytest.mark.django_db(transaction=True)
def test_an_archive_that_is_not_a_tar_fails_clearly(api, media, tmp_path):
    b = CaptureBuilder(tmp_path)
    state = upload(api, b"this is not a tar archive at all" * 100, b.session_id, instruction="x")
    capture = pipeline.process(state["id"])
    assert capture.status == "failed" and "not a readable tar archive" in capture.error


@pytest.mark.django_db(transaction=True)
def test_processing_twice_is_idempotent(api, media, tmp_path):
    b = CaptureBuilder(tmp_path)
    b.click(1.0, 10, 10)
    b.click(3.0, 300, 300)
    state = upload(api, b.archive(), b.session_id, instruction="two clicks")
    Capture.objects.filter(pk=state["id"]).update(status="processing")  # as if a worker died mid-way
    first = pipeline.process(state["id"])
    steps = list(first.trajectory.steps.values_list("action_text", flat=True))
    Capture.objects.filter(pk=first.pk).update(status="processing")  # redelivered after the work was done
    second = pipeline.process(first.pk)
    assert second.trajectory_id == first.trajectory_id
    assert list(second.trajectory.steps.values_list("action_text", flat=True)) == steps
    assert Trajectory.objects.count() == 1 and second.flags == ["too_few_actions", "too_short", "no_speech"][1:]
