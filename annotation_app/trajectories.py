"""Recording and reviewing trajectories: the rules that hold whether a page, the API or a worker does the work."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from sandbox.actions import action_to_dict, parse_actions

from . import task_queue
from .models import Assignment, Recording, Review, Step, Task, Trajectory, User
from .upload_checks import AUDIO_FORMATS, IMAGE_FORMATS, check_upload, count_event_lines


def typed_action(action_text: str) -> dict[str, Any]:
    """The stored, typed form of a step's action text, from the one grammar module (raises ActionSyntaxError)."""
    return {"actions": [action_to_dict(a) for a in parse_actions(action_text)]}


class Conflict(Exception):
    """The request is well formed but clashes with the current state (HTTP 409)."""


class Invalid(ValueError):
    """The request breaks a domain rule (HTTP 400)."""


def start_trajectory(
    annotator: User, task: Task, mode: str, *, screen_width: int = 1920, screen_height: int = 1080, **extra: Any
) -> Trajectory:
    """Open a trajectory for a task the annotator currently holds."""
    if mode == Trajectory.Mode.ROLLOUT:
        raise Invalid("Rollout trajectories are recorded by the flywheel, not by annotators.")
    holds = Assignment.objects.filter(task=task, annotator=annotator, status=Assignment.Status.ACTIVE).exists()
    if not holds:
        raise Conflict(f"Task {task.pk} is not assigned to you; take it from the queue first.")
    return Trajectory.objects.create(
        task=task, annotator=annotator, mode=mode, screen_width=screen_width, screen_height=screen_height, **extra
    )


def add_step(
    trajectory: Trajectory,
    *,
    fields: dict[str, Any],
    index: int | None = None,
    screenshot: UploadedFile | None = None,
    screenshot_sha256: str | None = None,
) -> Step:
    """Append a step. `index`, when given, must be the next one: a retried upload gets a 409, not a duplicate."""
    checked = None
    if screenshot is not None:
        checked = check_upload(
            screenshot,
            what="screenshot",
            max_bytes=settings.MAX_SCREENSHOT_BYTES,
            formats=IMAGE_FORMATS,
            expected_sha256=screenshot_sha256,
        )
    with transaction.atomic():
        Trajectory.objects.select_for_update().filter(pk=trajectory.pk).values_list("pk", flat=True).get()
        last = trajectory.steps.aggregate(last=Max("index"))["last"]
        expected = 0 if last is None else last + 1
        if index is not None and index != expected:
            raise Conflict(f"Step index {index} is out of order; the next step of this trajectory is {expected}.")
        step = Step(trajectory=trajectory, index=expected, **fields)
        if screenshot is not None and checked is not None:
            step.screenshot_sha256 = checked.sha256
            step.screenshot.save(f"step.{checked.content_type.split('/')[1]}", screenshot, save=False)
        try:
            step.save()
        except IntegrityError:
            if step.screenshot:
                step.screenshot.delete(save=False)
            raise
    Trajectory.objects.filter(pk=trajectory.pk).update(updated_at=timezone.now())
    return step


def add_recording(
    trajectory: Trajectory,
    *,
    audio: UploadedFile | None,
    events: UploadedFile | None,
    audio_sha256: str | None = None,
    events_sha256: str | None = None,
    duration_s: float | None = None,
) -> Recording:
    """Store think-aloud audio and/or the raw event log of a trajectory, after checking both."""
    if audio is None and events is None:
        raise Invalid("Send at least one of 'audio' and 'events'.")
    recording = Recording(trajectory=trajectory, duration_s=duration_s)
    if audio is not None:
        checked = check_upload(
            audio, what="audio", max_bytes=settings.MAX_AUDIO_BYTES, formats=AUDIO_FORMATS, expected_sha256=audio_sha256
        )
        recording.audio_sha256, recording.audio_content_type = checked.sha256, checked.content_type
    if events is not None:
        checked_events = check_upload(
            events, what="events", max_bytes=settings.MAX_EVENTS_BYTES, formats=None, expected_sha256=events_sha256
        )
        recording.event_count = count_event_lines(events)
        recording.events_sha256 = checked_events.sha256
    if audio is not None:
        recording.audio.save(f"audio.{recording.audio_content_type.split('/')[1]}", audio, save=False)
    if events is not None:
        recording.events.save("events.jsonl", events, save=False)
    recording.save()
    return recording


def submit(trajectory: Trajectory) -> Trajectory:
    """Close a trajectory for review and mark its assignment completed."""
    with transaction.atomic():
        locked = Trajectory.objects.select_for_update().get(pk=trajectory.pk)
        if locked.status != Trajectory.Status.IN_PROGRESS:
            raise Conflict(f"Trajectory {locked.pk} is already {locked.get_status_display().lower()}.")
        if not locked.steps.exists():
            raise Invalid("A trajectory needs at least one step before it can be submitted.")
        locked.status = Trajectory.Status.SUBMITTED
        locked.submitted_at = timezone.now()
        locked.save(update_fields=["status", "submitted_at", "updated_at"])
        if locked.annotator is not None:
            task_queue.complete_assignment(locked.annotator, locked.task)
    return locked


def review(
    trajectory: Trajectory, reviewer: User, verdict: str, *, score: int | None = None, comment: str = ""
) -> Review:
    """Record a data lead's verdict; the trajectory becomes approved or rejected (a later review overrides). The same
    path as the rubric's verdict panel (annotation_app.rubric), so the reviewer's queue assignment is closed too."""
    from . import rubric  # rubric imports only models; imported here to keep this module's import light

    parsed = rubric.Verdict(verdict=verdict, score=score, comment=comment)
    try:
        return rubric.record_verdict(trajectory, reviewer, parsed)
    except rubric.VerdictConflict as exc:
        raise Conflict(str(exc)) from None


# --- fixing a rejected trajectory (docs/live-annotation.md, "A rejected trajectory") -----------------------------

MAX_THOUGHT = 5000


def _rejected_of(trajectory: Trajectory, annotator: User) -> Trajectory:
    """The trajectory, locked, if it is the annotator's own and rejected; Conflict otherwise."""
    locked = Trajectory.objects.select_for_update().get(pk=trajectory.pk)
    if locked.annotator_id != annotator.pk:
        raise Conflict("Only the trajectory's own annotator can fix it.")
    if locked.status != Trajectory.Status.REJECTED:
        raise Conflict(f"Only a rejected trajectory can be fixed; this one is {locked.get_status_display().lower()}.")
    return locked


def clean_thought(text: str) -> str:
    """A thought as stored: one line's runs of spaces squeezed, several lines kept; Invalid past MAX_THOUGHT."""
    text = " ".join(text.split()) if "\n" not in text else text.strip()
    if len(text) > MAX_THOUGHT:
        raise Invalid(f"A thought is at most {MAX_THOUGHT:,} characters.")
    return text


def fix_thoughts(trajectory: Trajectory, annotator: User, thoughts: dict[int, str]) -> list[Step]:
    """Replace step thoughts of the annotator's rejected trajectory (actions stay: they were done on the screen).

    Each step's thought as it was before its first fix is kept in `metadata.thoughts_before_fix`, so the reviewer can
    see what changed; the steps changed are returned."""
    cleaned = {index: clean_thought(text) for index, text in thoughts.items()}
    with transaction.atomic():
        locked = _rejected_of(trajectory, annotator)
        steps = {s.index: s for s in locked.steps.filter(index__in=list(cleaned))}
        if missing := sorted(set(cleaned) - set(steps)):
            raise Invalid(f"Step {missing[0]} does not exist.")
        before = locked.metadata.setdefault("thoughts_before_fix", {})
        changed = []
        for index, text in cleaned.items():
            step = steps[index]
            if step.thought == text:
                continue
            before.setdefault(str(index), step.thought)
            step.thought = text
            step.save(update_fields=["thought"])
            changed.append(step)
        if changed:
            locked.save(update_fields=["metadata", "updated_at"])
    return changed


def resubmit(trajectory: Trajectory, annotator: User) -> Trajectory:
    """Send the annotator's fixed, rejected trajectory back to review: submitted again, its reviews kept (the
    review history shows the rejection before the new verdict), the resubmission noted in `metadata.resubmitted`."""
    with transaction.atomic():
        locked = _rejected_of(trajectory, annotator)
        locked.status = Trajectory.Status.SUBMITTED
        locked.submitted_at = timezone.now()
        locked.metadata.setdefault("resubmitted", []).append(locked.submitted_at.isoformat())
        locked.save(update_fields=["status", "submitted_at", "metadata", "updated_at"])
    return locked


def attempt_again(trajectory: Trajectory, annotator: User) -> Assignment:
    """Give the task of the annotator's rejected trajectory back to them for a new attempt (a new trajectory; the
    rejected one stays as it is). Refused while they hold another task or someone else holds this one."""
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=annotator.pk).values_list("pk", flat=True).get()
        locked = _rejected_of(trajectory, annotator)
        task = Task.objects.select_for_update().get(pk=locked.task_id)
        current = task_queue.current_assignment(annotator)
        if current is not None and current.task_id == task.pk:
            return current
        if current is not None:
            raise Conflict(f"You hold task #{current.task_id}: submit or skip it first, then try this one again.")
        if task.status == Task.Status.ARCHIVED:
            raise Conflict(f"Task #{task.pk} was archived by a data lead; it cannot be attempted again.")
        if Assignment.objects.filter(task=task, status=Assignment.Status.ACTIVE).exists():
            raise Conflict(f"Task #{task.pk} is being worked on by another annotator right now; try again later.")
        Task.objects.filter(pk=task.pk).update(status=Task.Status.ASSIGNED, updated_at=timezone.now())
        return Assignment.objects.create(task=task, annotator=annotator)
