"""A data lead's changes to single steps of a trajectory under review: verdicts, edits of thought or action, cuts.

The step row always holds the current (edited) value, so exports and validation read it as they read any step;
every change writes a StepEdit with the value before and after, so nothing is lost and the history can be shown.
Cut steps get Step.Status.CUT: kept for their history, left out of exports and validation, restorable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Prefetch, Q

from sandbox.actions import (
    ActionSyntaxError,
    action_points,
    action_to_dict,
    format_actions,
    out_of_bounds,
    parse_actions,
    parse_step,
)

from .models import Step, StepEdit, StepVerdict, Trajectory, User
from .trajectories import Conflict, Invalid, clean_thought

MAX_ACTION = 5000
# Verdicts that say a kept step is not fit for SFT (flywheel validation reads them).
BAD_VERDICTS = (
    StepVerdict.Verdict.WRONG_ACTION,
    StepVerdict.Verdict.WRONG_THOUGHT,
    StepVerdict.Verdict.BAD_SCREENSHOT,
)


def _editable(trajectory: Trajectory) -> None:
    """Reviewers change finished trajectories only: an in-progress one is still being recorded by its annotator."""
    if trajectory.status == Trajectory.Status.IN_PROGRESS:
        raise Conflict("This trajectory is still being recorded; review and edit it once it is submitted.")


def _locked_step(step: Step) -> tuple[Trajectory, Step]:
    """The step and its trajectory, locked for the change (two reviewers' edits never interleave)."""
    trajectory = Trajectory.objects.select_for_update().get(pk=step.trajectory_id)
    _editable(trajectory)
    return trajectory, Step.objects.get(pk=step.pk)


def set_verdict(step: Step, reviewer: User, verdict: str, note: str = "") -> StepVerdict:
    """Record the reviewer's verdict on one step (their earlier one on it is replaced)."""
    if verdict not in StepVerdict.Verdict.values:
        choices = ", ".join(StepVerdict.Verdict.values)
        raise Invalid(f"'{verdict}' is not a step verdict; choose one of {choices}.")
    if len(note) > 2000:
        raise Invalid("A verdict's note is at most 2,000 characters.")
    with transaction.atomic():
        _, step = _locked_step(step)
        if step.status == Step.Status.CUT:
            raise Conflict(f"Step {step.index} is cut; restore it before judging it.")
        result, _ = StepVerdict.objects.update_or_create(
            step=step, reviewer=reviewer, defaults={"verdict": verdict, "note": note.strip()}
        )
    return result


def check_action(text: str, width: int, height: int) -> list[dict[str, Any]]:
    """The typed actions of `text` if it is valid UI-TARS action text with every point on the screen; Invalid names
    the problem (line and column from the grammar)."""
    if not text.strip():
        raise Invalid("Write an action, e.g. click(start_box='(100,200)').")
    if len(text) > MAX_ACTION:
        raise Invalid(f"An action is at most {MAX_ACTION:,} characters.")
    try:
        actions = parse_actions(text)
    except ActionSyntaxError as exc:
        raise Invalid(f"The action does not parse: {exc}") from None
    problems = out_of_bounds(actions, width, height)
    if problems:
        raise Invalid("The action is off the screen: " + "; ".join(problems) + ".")
    return [action_to_dict(a) for a in actions]


def edit_thought(step: Step, editor: User, text: str) -> Step:
    """Replace a step's thought, keeping the old one in a StepEdit; unchanged text writes nothing."""
    text = clean_thought(text)
    with transaction.atomic():
        _, step = _locked_step(step)
        _not_cut(step)
        if step.thought == text:
            return step
        StepEdit.objects.create(step=step, editor=editor, field=StepEdit.Field.THOUGHT, before=step.thought, after=text)
        step.thought = text
        step.save(update_fields=["thought"])
    return step


def edit_action(step: Step, editor: User, text: str) -> Step:
    """Replace a step's action with grammar-checked text (stored canonically, in screen pixels), keeping the old one
    in a StepEdit; the typed `action` follows, its other keys (an in-situ step's times) kept."""
    with transaction.atomic():
        trajectory, step = _locked_step(step)
        _not_cut(step)
        typed = check_action(text, trajectory.screen_width, trajectory.screen_height)
        canonical = format_actions(parse_actions(text))
        if step.action_text == canonical:
            return step
        StepEdit.objects.create(
            step=step, editor=editor, field=StepEdit.Field.ACTION, before=step.action_text, after=canonical
        )
        extra = {k: v for k, v in step.action.items() if k != "actions"} if isinstance(step.action, dict) else {}
        step.action_text, step.action = canonical, {**extra, "actions": typed}
        step.save(update_fields=["action_text", "action"])
    return step


def _not_cut(step: Step) -> None:
    if step.status == Step.Status.CUT:
        raise Conflict(f"Step {step.index} is cut; restore it before editing it.")


def cut(trajectory: Trajectory, editor: User, index: int) -> list[Step]:
    """Cut the trajectory at step `index`: it and every later step get status CUT (each change a StepEdit holding
    the status before, so a restore puts it back). The steps before it stay; cutting at step 0 is refused."""
    with transaction.atomic():
        locked = Trajectory.objects.select_for_update().get(pk=trajectory.pk)
        _editable(locked)
        steps = list(locked.steps.filter(index__gte=index).order_by("index"))
        if not steps or steps[0].index != index:
            raise Invalid(f"Step {index} does not exist.")
        if index == 0:
            raise Invalid("Cutting at step 0 would leave no step; reject the trajectory instead.")
        changed = [s for s in steps if s.status != Step.Status.CUT]
        if not changed:
            raise Conflict(f"Step {index} and the steps after it are cut already.")
        StepEdit.objects.bulk_create(
            StepEdit(step=s, editor=editor, field=StepEdit.Field.STATUS, before=s.status, after=Step.Status.CUT)
            for s in changed
        )
        Step.objects.filter(pk__in=[s.pk for s in changed]).update(status=Step.Status.CUT)
    return changed


def restore(trajectory: Trajectory, editor: User, index: int) -> list[Step]:
    """Undo a cut from step `index` on: each cut step gets back the status it had before its cut. Refused while an
    earlier step is still cut (the kept steps must stay numbered 0..n-1)."""
    with transaction.atomic():
        locked = Trajectory.objects.select_for_update().get(pk=trajectory.pk)
        _editable(locked)
        earlier = locked.steps.filter(index__lt=index, status=Step.Status.CUT).order_by("index").first()
        if earlier is not None:
            raise Conflict(f"Step {earlier.index} before it is cut too; restore from step {earlier.index}.")
        steps = list(locked.steps.filter(index__gte=index, status=Step.Status.CUT).order_by("index"))
        if not steps:
            raise Invalid(f"No step from {index} on is cut; there is nothing to restore.")
        before = _status_before_cut([s.pk for s in steps])
        edits = []
        for step in steps:
            step.status = before.get(step.pk, Step.Status.DONE)
            step.save(update_fields=["status"])
            edits.append(
                StepEdit(
                    step=step, editor=editor, field=StepEdit.Field.STATUS, before=Step.Status.CUT, after=step.status
                )
            )
        StepEdit.objects.bulk_create(edits)
    return steps


def _status_before_cut(step_ids: list[int]) -> dict[int, str]:
    """Each step's status before its latest cut, from its StepEdits."""
    out: dict[int, str] = {}
    edits = StepEdit.objects.filter(step_id__in=step_ids, field=StepEdit.Field.STATUS, after=Step.Status.CUT)
    for step_id, before in edits.order_by("created_at", "id").values_list("step_id", "before"):
        out[step_id] = before if before in Step.Status.values and before != Step.Status.CUT else Step.Status.DONE
    return out


# --- what the flywheel's validation reads ------------------------------------------------------------------------


def open_bad_verdicts(trajectory_ids: Iterable[int]) -> dict[int, list[tuple[int, str]]]:
    """Per trajectory, the (step index, verdict) of every non-ok verdict on a kept step that no later edit answered
    (a wrong action edited after the verdict, a wrong thought rewritten after it): one query."""
    later = StepEdit.objects.filter(step=OuterRef("step"), created_at__gt=OuterRef("updated_at"))
    rows = (
        StepVerdict.objects.filter(step__trajectory_id__in=list(trajectory_ids), verdict__in=BAD_VERDICTS)
        .exclude(step__status=Step.Status.CUT)
        .alias(
            action_fixed=Exists(later.filter(field=StepEdit.Field.ACTION)),
            thought_fixed=Exists(later.filter(field=StepEdit.Field.THOUGHT)),
        )
        .exclude(Q(verdict=StepVerdict.Verdict.WRONG_ACTION, action_fixed=True))
        .exclude(Q(verdict=StepVerdict.Verdict.WRONG_THOUGHT, thought_fixed=True))
        .order_by("step__trajectory_id", "step__index", "verdict")
        .values_list("step__trajectory_id", "step__index", "verdict")
        .distinct()
    )
    out: dict[int, list[tuple[int, str]]] = {}
    for trajectory_id, index, verdict in rows:
        out.setdefault(trajectory_id, []).append((index, verdict))
    return out


# --- the player's data -------------------------------------------------------------------------------------------


def _typed(action_text: str) -> tuple[list[Any], str]:
    """The parsed actions of a stored step, or none and the grammar's message (a step stored before a check)."""
    try:
        return parse_actions(action_text), ""
    except ActionSyntaxError as exc:
        return [], str(exc)


def _sections(step: Step) -> dict[str, str]:
    """Reflection and action summary of the accepted proposal, when the model wrote them (steps store the thought)."""
    if step.chosen_candidate is None or not 0 <= step.chosen_candidate < len(step.candidates or []):
        return {"reflection": "", "action_summary": ""}
    raw = (step.candidates[step.chosen_candidate] or {}).get("raw") or ""
    try:
        parsed = parse_step(raw) if raw else None
    except ActionSyntaxError:
        parsed = None
    return {
        "reflection": parsed.reflection if parsed else "",
        "action_summary": parsed.action_summary if parsed else "",
    }


def _spans(steps: list[Step], alignment: list[Any], offset: float) -> list[dict[str, Any] | None]:
    """Each in-situ step's span on the audio's clock: from the end of the previous step's action (or the start) to
    the end of its own, so it covers the words said before it; None without times."""
    spans: list[dict[str, Any] | None] = []
    previous = 0.0
    for step in steps:
        times = step.action.get("t") if isinstance(step.action, dict) else None
        aligned = (
            alignment[step.index] if step.index < len(alignment) and isinstance(alignment[step.index], dict) else {}
        )
        words = [w for w in aligned.get("words") or [] if isinstance(w, dict)]
        if not (isinstance(times, list) and len(times) == 2):
            spans.append(None)
            continue
        start = min([previous, *(float(w.get("start", previous)) for w in words)])
        end = max([float(times[1]), *(float(w.get("end", 0)) for w in words)])
        spans.append({"start": round(max(start - offset, 0.0), 3), "end": round(max(end - offset, 0.0), 3)})
        previous = float(times[1])
    return spans


def step_json(step: Step, *, span: dict[str, Any] | None = None, words: list[Any] | None = None) -> dict[str, Any]:
    """One step as the player draws it (prefetched verdicts and edits are used when present)."""
    actions, error = _typed(step.action_text)
    candidates = []
    for n, c in enumerate(step.candidates or []):
        candidates.append(
            {
                "n": n,
                "thought": c.get("thought", ""),
                "action_text": c.get("action_text", ""),
                "points": c.get("points", []),
                "error": c.get("error", ""),
                "raw": c.get("raw", ""),
                "chosen": step.chosen_candidate == n,
            }
        )
    return {
        "index": step.index,
        "screenshot": step.screenshot.url if step.screenshot else None,
        "thought": step.thought,
        **_sections(step),
        "action_text": step.action_text,
        "actions": [action_to_dict(a) for a in actions],
        "points": [[p.x, p.y] for a in actions for p in action_points(a)],
        "action_error": error,
        "status": step.status,
        "source": step.source,
        "error": step.error,
        "candidates": candidates,
        "chosen_candidate": step.chosen_candidate,
        "overridden": bool(candidates) and step.chosen_candidate is None,
        "latency_ms": step.model_latency_ms,
        "verdicts": [
            {"reviewer": v.reviewer.username, "reviewer_id": v.reviewer_id, "verdict": v.verdict, "note": v.note}
            for v in step.verdicts.all()
        ],
        "history": [
            {
                "field": e.field,
                "before": e.before,
                "after": e.after,
                "editor": e.editor.username,
                "at": e.created_at.isoformat(timespec="seconds"),
            }
            for e in step.edits.all()
        ],
        "span": span,
        "words": words or [],
    }


def steps_queryset(trajectory: Trajectory) -> Any:
    """The trajectory's steps with what the player shows of each, in three queries whatever their number."""
    return trajectory.steps.order_by("index").prefetch_related(
        Prefetch("verdicts", StepVerdict.objects.select_related("reviewer").order_by("id")),
        Prefetch("edits", StepEdit.objects.select_related("editor")),
    )


def one_step(trajectory: Trajectory, index: int) -> Step | None:
    return steps_queryset(trajectory).filter(index=index).first()


def player_data(trajectory: Trajectory) -> dict[str, Any]:
    """Everything the player draws: the screen size the actions are in, and every step (with its audio span and
    spoken words for an in-situ capture)."""
    steps = list(steps_queryset(trajectory))
    capture = getattr(trajectory, "capture", None) if trajectory.mode == Trajectory.Mode.IN_SITU else None
    alignment = (capture.alignment or []) if capture is not None else []
    offset = float(((capture.meta or {}).get("audio") or {}).get("offset", 0.0)) if capture is not None else 0.0
    spans = _spans(steps, alignment, offset) if capture is not None else [None] * len(steps)
    out = []
    for step, span in zip(steps, spans, strict=True):
        aligned = (
            alignment[step.index] if step.index < len(alignment) and isinstance(alignment[step.index], dict) else {}
        )
        words = [
            {
                "text": w.get("text", ""),
                "start": round(float(w["start"]) - offset, 3),
                "end": round(float(w["end"]) - offset, 3),
            }
            for w in aligned.get("words") or []
            if isinstance(w, dict) and "start" in w and "end" in w
        ]
        out.append(step_json(step, span=span, words=words))
    return {
        "trajectory": trajectory.pk,
        "screen": {"width": trajectory.screen_width, "height": trajectory.screen_height},
        "mode": trajectory.mode,
        "steps": out,
    }
