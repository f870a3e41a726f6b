"""What the annotator does with a processed capture on its timeline page: fix thoughts, submit, or delete it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from ..models import Capture, Step, Trajectory
from ..trajectories import MAX_THOUGHT as MAX_THOUGHT  # the API's limit on a thought
from ..trajectories import Conflict, Invalid, clean_thought, fix_thoughts, resubmit, submit


def fixable(capture: Capture) -> bool:
    """A submitted capture whose trajectory the data lead rejected: its annotator may fix thoughts and resubmit."""
    trajectory = capture.trajectory
    return (
        capture.status == Capture.Status.SUBMITTED
        and trajectory is not None
        and trajectory.status == Trajectory.Status.REJECTED
    )


def _editable(capture: Capture) -> Trajectory:
    if fixable(capture):
        return capture.trajectory
    if capture.status != Capture.Status.READY or capture.trajectory is None:
        raise Conflict(f"This capture is {capture.get_status_display().lower()}; only a ready one can be changed.")
    if capture.trajectory.status != Trajectory.Status.IN_PROGRESS:
        raise Conflict("This trajectory was already submitted.")
    return capture.trajectory


def edit_thought(capture: Capture, index: int, text: str) -> Step:
    """Replace one step's thought (the raw transcript stays on the capture's alignment); on a rejected capture the
    thought before the fix is kept too (trajectories.fix_thoughts)."""
    trajectory = _editable(capture)
    if trajectory.status == Trajectory.Status.REJECTED:
        fix_thoughts(trajectory, capture.annotator, {index: text})
        return trajectory.steps.get(index=index)
    text = clean_thought(text)
    step = trajectory.steps.filter(index=index).first()
    if step is None:
        raise Invalid(f"Step {index} does not exist.")
    step.thought = text
    step.save(update_fields=["thought"])
    return step


def submit_capture(capture: Capture) -> Capture:
    """Send the trajectory to the data lead's review (again, once fixed after a rejection); then it is read-only."""
    trajectory = _editable(capture)
    with transaction.atomic():
        if trajectory.status == Trajectory.Status.REJECTED:
            resubmit(trajectory, capture.annotator)
        else:
            submit(trajectory)
        Capture.objects.filter(pk=capture.pk).update(status=Capture.Status.SUBMITTED)
    capture.refresh_from_db()
    return capture


def delete_capture(capture: Capture) -> None:
    """Remove a capture not yet submitted, with its files and draft trajectory (the annotator's privacy control)."""
    if capture.status == Capture.Status.SUBMITTED:
        raise Conflict("A submitted capture belongs to the review now; ask a data lead to remove it.")
    if capture.status == Capture.Status.PROCESSING:
        raise Conflict("The capture is being processed; delete it once that finishes.")
    if capture.status == Capture.Status.RECORDING:
        from .browser import abandon

        abandon(capture)  # give the sandbox desktop back first
    pk, trajectory = capture.pk, capture.trajectory
    with transaction.atomic():
        capture.delete()
        if trajectory is not None and trajectory.status == Trajectory.Status.IN_PROGRESS:
            trajectory.delete()
    shutil.rmtree(Path(settings.MEDIA_ROOT) / f"captures/{pk}", ignore_errors=True)


def timeline_json(capture: Capture) -> dict[str, Any]:
    """Steps with their words, times and screenshots: what the timeline page and the API show."""
    steps = list(capture.trajectory.steps.order_by("index")) if capture.trajectory else []
    alignment = capture.alignment or []
    out = []
    for step in steps:
        aligned = alignment[step.index] if step.index < len(alignment) else {}
        out.append(
            {
                "index": step.index,
                "thought": step.thought,
                "raw": aligned.get("raw", ""),
                "refined": aligned.get("refined"),
                "words": aligned.get("words", []),
                "action_text": step.action_text,
                "action": step.action,
                "screenshot": step.screenshot.url if step.screenshot else None,
            }
        )
    return {
        "id": capture.pk,
        "status": capture.status,
        "stage": capture.stage,
        "progress": capture.progress,
        "error": capture.error,
        "instruction": capture.instruction,
        "flags": capture.flags,
        "warnings": capture.warnings,
        "audio_offset": ((capture.meta or {}).get("audio") or {}).get("offset", 0.0),
        "screen": (capture.meta or {}).get("screen"),
        "steps": out,
    }
