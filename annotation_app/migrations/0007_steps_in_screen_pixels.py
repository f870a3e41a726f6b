"""Data: every step's action in screen pixels, every stored candidate in the one shape (annotation_app.candidates).

Live steps were stored in the frame of the image the model saw: its size is the live session's `model_width` x
`model_height`, which the sandbox service derived from the screen (`ScreenMapping(screen).model_size`, the
smart-resized size); the screen size is the trajectory's. Their actions and candidates are converted with
`ScreenMapping.to_screen`, the conversion the sandbox applied when it ran them, so each stored point is the pixel that
was clicked. In-situ and API steps were already in screen pixels; only their candidates change shape:
`{thought, action}` (seed_demo, seed_bench, the steps API) becomes `{thought, action_text, actions, points, raw,
error, model}`, and an `action` without the typed `actions` (seed_bench's `{type, x, y}`) is parsed again from
`action_text`.

Reversing converts live steps back with `to_model` (within a pixel of the original: screen pixels are coarser than
the model frame when the model image is larger); candidates keep the new shape, which holds the old fields.
The candidate building is frozen here, as it was when this migration was written.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from sandbox.actions import ActionSyntaxError, action_points, action_to_dict, format_actions, parse_actions
from sandbox.coordinates import mapping_for, map_points

TEXT = ("thought", "action_text", "raw", "error", "model")


def _candidate(thought: str, action_text: str, raw: str, error: str, model: str) -> dict[str, Any]:
    actions = []
    if action_text.strip():
        try:
            actions = parse_actions(action_text)
        except ActionSyntaxError as exc:
            raw, error, actions = raw or action_text, error or f"does not parse: {exc}", []
    elif not error:
        error = "no action"
    return {
        "thought": thought.strip(),
        "action_text": format_actions(actions),
        "actions": [action_to_dict(a) for a in actions],
        "points": [[p.x, p.y] for a in actions for p in action_points(a)],
        "raw": raw,
        "error": error,
        "model": model,
    }


def _reshaped(item: Any, convert=None) -> dict[str, Any]:
    """One stored candidate of any earlier shape in the one shape; `convert` maps its points (None: as they are)."""
    if not isinstance(item, dict):
        return _candidate("", "", str(item), "not a candidate object", "")
    text = {key: item.get(key) if isinstance(item.get(key), str) else "" for key in TEXT}
    if not text["action_text"] and isinstance(item.get("action"), str):  # the {thought, action} shape
        text["action_text"] = item["action"]
    if convert is not None and text["action_text"]:
        if text["error"]:  # off the model image: no screen pixel matches; raw keeps what the model wrote
            text["raw"] = text["raw"] or text["action_text"]
            text["action_text"] = ""
        else:
            text["action_text"] = _converted(text["action_text"], convert)
    return _candidate(**text)


def _converted(action_text: str, convert) -> str:
    try:
        return format_actions(map_points(parse_actions(action_text), convert))
    except ActionSyntaxError:
        return action_text  # _candidate records it as invalid


def _convert_steps(apps, direction: str) -> None:
    Step = apps.get_model("annotation_app", "Step")
    LiveSession = apps.get_model("annotation_app", "LiveSession")
    frames = {}
    for live in LiveSession.objects.select_related("trajectory").exclude(model_width=0).iterator():
        t = live.trajectory
        try:
            mapping = mapping_for(t.screen_width, t.screen_height, live.model_width, live.model_height)
        except ValueError as exc:  # never written by this code: refuse rather than guess
            raise RuntimeError(f"trajectory {t.pk}: its live steps' frame is unknown ({exc})") from exc
        frames[t.pk] = mapping.to_screen if direction == "to_screen" else mapping.to_model
    for step in Step.objects.filter(trajectory_id__in=list(frames)).iterator():
        convert = frames[step.trajectory_id]
        try:
            actions = map_points(parse_actions(step.action_text), convert)
        except ActionSyntaxError:
            continue  # nothing that could run, nothing to convert
        step.action_text = format_actions(actions)
        step.action = {**(step.action or {}), "actions": [action_to_dict(a) for a in actions]}
        step.candidates = [_reshaped(c, convert) for c in step.candidates or []]
        step.save(update_fields=["action_text", "action", "candidates"])


def forwards(apps, schema_editor) -> None:
    _convert_steps(apps, "to_screen")
    Step = apps.get_model("annotation_app", "Step")
    others = Step.objects.filter(trajectory__live__isnull=True).exclude(candidates=[], action__has_key="actions")
    for step in others.iterator():
        step.candidates = [_reshaped(c) for c in step.candidates]
        if "actions" not in (step.action or {}):  # seed_bench wrote {type, x, y}: the typed form of action_text
            try:
                step.action = {"actions": [action_to_dict(a) for a in parse_actions(step.action_text)]}
            except ActionSyntaxError:
                pass
        step.save(update_fields=["candidates", "action"])


def backwards(apps, schema_editor) -> None:
    _convert_steps(apps, "to_model")


class Migration(migrations.Migration):
    dependencies = [("annotation_app", "0006_step_status_and_frame")]

    operations = [migrations.RunPython(forwards, backwards)]
