"""Process an uploaded capture into an in-situ trajectory: unpack → events → actions → transcript → alignment →
(refinement) → trajectory with steps, recording and curation flags. Runs in the `asr` Celery queue.

Idempotent: a capture already processed is left alone, and a rerun of an interrupted one rebuilds its trajectory's
steps from the archive (which is never modified). Problems with the material itself end in `failed` with a message
for the annotator; problems with audio alone keep the actions and say the thoughts must be typed.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files import File
from django.db import transaction

from sandbox.actions import Finished, format_action
from training.policy.client import PolicyError

from .. import queues
from ..models import Assignment, Capture, Recording, Step, Task, Trajectory
from ..trajectories import Conflict
from . import curate
from .align import AlignedStep, align
from .archive import CaptureError, CaptureFiles, unpack
from .audio import AudioError, load_audio
from .events import EventLog, EventLogError, parse_lines
from .reduce import ReducedAction, reduce_events

log = logging.getLogger(__name__)
DUPLICATE_WINDOW = 200  # compare with this many of the annotator's most recent captures


class Progress:
    """Writes the capture's stage and progress, at most a few times a second (the page polls it)."""

    def __init__(self, capture: Capture, every_s: float = 0.5):
        self.capture, self.every_s, self.last = capture, every_s, 0.0

    def __call__(self, stage: str, fraction: float, *, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        self.capture.stage, self.capture.progress = stage, round(min(max(fraction, 0.0), 1.0), 3)
        Capture.objects.filter(pk=self.capture.pk).update(stage=stage, progress=self.capture.progress)


def work_dir(capture: Capture) -> Path:
    return Path(settings.MEDIA_ROOT) / f"captures/{capture.pk}/unpacked"


def process(capture_id: int) -> Capture:
    """Run the whole pipeline for one capture (see the module docstring)."""
    capture = Capture.objects.get(pk=capture_id)
    not_queued = (Capture.Status.READY, Capture.Status.SUBMITTED, Capture.Status.RECEIVING, Capture.Status.VERIFYING)
    if capture.status in not_queued:
        return capture
    Capture.objects.filter(pk=capture.pk).update(status=Capture.Status.PROCESSING, error="")
    progress = Progress(capture)
    try:
        _process(capture, progress)
    except (CaptureError, EventLogError) as exc:
        mark_failed(capture.pk, str(exc))
        capture.refresh_from_db()
        return capture
    Capture.objects.filter(pk=capture.pk).update(status=Capture.Status.READY, stage="ready", progress=1.0)
    capture.refresh_from_db()
    return capture


def mark_failed(capture_id: int, message: str) -> None:
    Capture.objects.filter(pk=capture_id).update(status=Capture.Status.FAILED, error=message, stage="failed")


def requeue(capture: Capture) -> None:
    """Process a failed capture again (after a fix on the server, or a transient failure)."""
    if capture.status != Capture.Status.FAILED:
        raise Conflict(f"Only a failed capture can be processed again; this one is {capture.get_status_display()}.")
    Capture.objects.filter(pk=capture.pk).update(status=Capture.Status.QUEUED, stage="queued", progress=0.0, error="")
    transaction.on_commit(lambda: queues.enqueue(queues.PROCESS_CAPTURE, capture.pk))


def _process(capture: Capture, progress: Progress) -> None:
    progress("unpacking", 0.01)
    root = work_dir(capture)
    shutil.rmtree(root, ignore_errors=True)
    files = unpack(Path(settings.MEDIA_ROOT) / capture.archive_path, root)
    warnings = [f"ignored {len(files.skipped)} file(s) that are not part of a capture"] if files.skipped else []

    progress("reading events", 0.05)
    with files.events.open("rb") as lines:
        event_log = parse_lines(lines, max_events=settings.MAX_CAPTURE_EVENTS)
    warnings += event_log.warnings
    if not any(e["type"] in ("down", "key_down", "scroll") for e in event_log.events):
        raise CaptureError(
            "The capture has no clicks, keys or scrolls: nothing was done on screen, so there is no step."
        )
    reduction = reduce_events(event_log.events)
    warnings += reduction.warnings
    missing = {a.frame for a in reduction.actions if a.frame and a.frame not in files.frames}
    if missing:
        warnings.append(f"{len(missing)} screenshot(s) named by events are not in the archive")

    transcript = _transcribe(files, progress, warnings)
    progress("aligning", 0.85)
    offset = (files.session.get("audio") or {}).get("offset", 0.0)
    words = [_Word(w) for segment in transcript.get("segments", []) for w in segment.get("words", [])]
    steps = align(reduction.actions, words, audio_offset=offset, attach=settings.INSITU_ATTACH)
    end = max(event_log.events[-1]["t"], reduction.actions[-1].end)
    steps[-1].action = ReducedAction(Finished(), end, end)
    instruction = capture.instruction or files.session.get("instruction", "")
    refined = _refine(instruction, steps, progress, warnings) if settings.INSITU_REFINE else None

    progress("curating", 0.9)
    screen = files.session["screen"]
    hashes = [
        curate.dhash(root / f)
        for f in dict.fromkeys(a.frame for a in reduction.actions if a.frame)
        if f in files.frames
    ]
    signature = curate.signature(reduction.actions, hashes, screen["width"], screen["height"])
    flags = curate.quality_flags(event_log.duration, len(reduction.actions), len(words))
    flags += _duplicates(capture, signature)

    progress("saving", 0.93)
    with transaction.atomic():
        trajectory = _trajectory(capture, files, instruction)
        trajectory.steps.all().delete()
        trajectory.recordings.all().delete()
        for index, step in enumerate(steps):
            _save_step(trajectory, index, step, root, files, refined[index] if refined else None)
        _save_recording(trajectory, files, transcript, event_log)
        Capture.objects.filter(pk=capture.pk).update(
            trajectory=trajectory,
            meta=files.session,
            transcript=transcript,
            alignment=[
                {"words": s.words, "raw": s.thought, "refined": refined[i] if refined else None}
                for i, s in enumerate(steps)
            ],
            warnings=warnings,
            flags=flags,
            signature=signature,
        )


class _Word:
    """A transcript word as stored (JSON) with the attributes align() reads."""

    __slots__ = ("end", "start", "text")

    def __init__(self, data: dict[str, Any]):
        self.text, self.start, self.end = data["text"], data["start"], data["end"]


def _transcribe(files: CaptureFiles, progress: Progress, warnings: list[str]) -> dict[str, Any]:
    """The transcript as JSON; an unusable audio track becomes a warning (the actions are still worth keeping)."""
    if files.audio is None:
        warnings.append("the capture has no audio: type the thoughts on the timeline")
        return {}
    from .asr import get_transcriber

    progress("decoding audio", 0.08)
    try:
        audio = load_audio(files.audio, max_seconds=settings.MAX_CAPTURE_AUDIO_S, warnings=warnings)
    except AudioError as exc:
        warnings.append(f"the audio could not be used ({exc}); type the thoughts on the timeline")
        return {}
    transcriber = get_transcriber(settings.ASR_BACKEND or None, settings.ASR_MODEL_PATH or None)
    progress("transcribing", 0.1)
    transcript = transcriber.transcribe(audio, progress=lambda f: progress("transcribing", 0.1 + 0.75 * f, force=False))
    return transcript.to_json()


def _refine(instruction: str, steps: list[AlignedStep], progress: Progress, warnings: list[str]) -> list[str | None]:
    """Refined thoughts per step (None where nothing was said or the model failed); needs an active model."""
    from flywheel.models import ModelVersion

    from ..live.sessions import policy_for

    model = ModelVersion.objects.filter(is_active=True).first()
    if model is None:
        warnings.append("refinement is on but no model is active; the thoughts are the raw transcript")
        return [None] * len(steps)
    from .refine import refine_thought

    out: list[str | None] = []
    client = policy_for(model)
    for i, step in enumerate(steps):
        progress("refining", 0.85 + 0.05 * i / len(steps), force=False)
        raw = step.thought
        if not raw:
            out.append(None)
            continue
        try:
            out.append(refine_thought(client, instruction, raw, format_action(step.action.action)))
        except PolicyError as exc:
            warnings.append(f"refinement stopped at step {i} ({exc}); later thoughts are the raw transcript")
            out += [None] * (len(steps) - i)
            break
    return out


def _duplicates(capture: Capture, signature: dict[str, Any]) -> list[str]:
    others = (
        Capture.objects.filter(annotator=capture.annotator, status__in=["ready", "submitted"])
        .exclude(pk=capture.pk)
        .exclude(signature={})
        .order_by("-created_at")
        .values_list("pk", "signature")[:DUPLICATE_WINDOW]
    )
    return [f"near_duplicate:{pk}" for pk, other in others if curate.is_near_duplicate(signature, other)][:3]


def _trajectory(capture: Capture, files: CaptureFiles, instruction: str) -> Trajectory:
    if capture.trajectory_id is not None:
        return capture.trajectory  # type: ignore[return-value]
    task = capture.task
    if task is None:  # free-form: the annotator's own instruction becomes a task of theirs
        task = Task.objects.create(
            instruction=instruction,
            status=Task.Status.COMPLETED,
            created_by=capture.annotator,
            metadata={"source": "in_situ_free_form", "capture": capture.pk},
        )
        Assignment.objects.create(task=task, annotator=capture.annotator, status=Assignment.Status.COMPLETED)
        Capture.objects.filter(pk=capture.pk).update(task=task)
    screen = files.session["screen"]
    return Trajectory.objects.create(
        task=task,
        annotator=capture.annotator,
        mode=Trajectory.Mode.IN_SITU,
        screen_width=screen["width"],
        screen_height=screen["height"],
        metadata={"capture": capture.pk, "platform": files.session.get("platform", ""), "source": capture.source},
    )


def _save_step(
    trajectory: Trajectory, index: int, aligned: AlignedStep, root: Path, files: CaptureFiles, refined: str | None
) -> None:
    reduced = aligned.action
    assert reduced is not None
    step = Step(
        trajectory=trajectory,
        index=index,
        thought=refined or aligned.thought,
        action_text=format_action(reduced.action),
        action={"actions": [reduced.to_json()], "t": [round(reduced.start, 3), round(reduced.end, 3)]},
        source=Step.Source.HUMAN,
    )
    if reduced.frame and reduced.frame in files.frames:
        with (root / reduced.frame).open("rb") as frame:
            step.screenshot.save(reduced.frame.rsplit("/", 1)[-1], File(frame), save=False)
    step.save()


def _save_recording(
    trajectory: Trajectory, files: CaptureFiles, transcript: dict[str, Any], event_log: EventLog
) -> None:
    recording = Recording(trajectory=trajectory, duration_s=event_log.duration, event_count=len(event_log.events))
    recording.transcript = [
        {"start": s["start"], "end": s["end"], "text": s["text"]} for s in transcript.get("segments", [])
    ]
    if files.audio is not None:
        suffix = files.audio.suffix.lstrip(".")
        recording.audio_content_type = f"audio/{suffix}"
        with files.audio.open("rb") as audio:
            recording.audio.save(f"audio.{suffix}", File(audio), save=False)
    with files.events.open("rb") as events:
        recording.events.save("events.jsonl", File(events), save=False)
    recording.save()
