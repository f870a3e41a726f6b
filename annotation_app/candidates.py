"""One shape for the model proposals shown at a step, built and checked in one place wherever candidates are written.

A candidate is a dict with exactly these keys:

- `thought`: the proposal's thought;
- `action_text`: its canonical action text (sandbox.actions); "" when what the model wrote did not parse;
- `actions`, `points`: the typed form of `action_text` and the points it touches, always derived from it here;
- `raw`: what the model wrote, verbatim ("" when not known, e.g. a candidate sent through the API);
- `error`: why it must not run ("" for a valid candidate); `model`: the served model's name ("" when not known).

Coordinates are in the frame of the record that holds the candidate: a live session's proposals are in the model
image's frame (they are drawn on the screenshot the model saw), a stored step's candidates are in screen pixels like
the step's action (`to_screen` converts them when the step is stored). `raw` stays as the model wrote it.
"""

from __future__ import annotations

from typing import Any

from sandbox.actions import ActionSyntaxError, action_points, action_to_dict, format_actions, parse_actions
from sandbox.coordinates import ScreenMapping, map_points
from training.policy.client import Proposal

FIELDS = ("thought", "action_text", "actions", "points", "raw", "error", "model")
TEXT_FIELDS = ("thought", "action_text", "raw", "error", "model")
MAX_TEXT = 20_000


class CandidateError(ValueError):
    """A candidate that is not of the one shape, or whose action does not parse."""


def candidate(
    *, thought: str = "", action_text: str = "", raw: str = "", error: str = "", model: str = ""
) -> dict[str, Any]:
    """A checked candidate: `action_text` parsed and written canonically, `actions` and `points` derived from it.
    A valid candidate (no `error`) needs an action; one that does not parse raises CandidateError."""
    for name, value in (("thought", thought), ("action_text", action_text), ("raw", raw), ("error", error),
                        ("model", model)):  # fmt: skip
        if not isinstance(value, str):
            raise CandidateError(f"'{name}' must be a string, not {type(value).__name__}")
        if len(value) > MAX_TEXT:
            raise CandidateError(f"'{name}' is longer than {MAX_TEXT:,} characters")
    actions = []
    if action_text.strip():
        try:
            actions = parse_actions(action_text)
        except ActionSyntaxError as exc:
            raise CandidateError(f"'action_text' is not a valid UI-TARS action: {exc}") from None
    elif not error:
        raise CandidateError("a valid candidate needs an 'action_text' (an invalid one names its 'error')")
    return {
        "thought": thought.strip(),
        "action_text": format_actions(actions),
        "actions": [action_to_dict(a) for a in actions],
        "points": [[p.x, p.y] for a in actions for p in action_points(a)],
        "raw": raw,
        "error": error,
        "model": model,
    }


def check_candidates(value: Any) -> list[dict[str, Any]]:
    """A list of candidate dicts (API input) rebuilt in the one shape; CandidateError names the item and the key.
    `actions` and `points` may be sent back as they were read, but are derived again, never taken as given."""
    if not isinstance(value, list):
        raise CandidateError("candidates must be a list of objects")
    out = []
    for n, item in enumerate(value, start=1):
        if not isinstance(item, dict):
            raise CandidateError(f"candidate {n}: must be an object with {', '.join(TEXT_FIELDS)}")
        unknown = sorted(set(item) - set(FIELDS))
        if unknown:
            hint = " (the action goes in 'action_text')" if "action" in unknown else ""
            raise CandidateError(f"candidate {n}: unknown key(s) {', '.join(map(repr, unknown))}{hint}")
        try:
            out.append(candidate(**{key: item.get(key, "") for key in TEXT_FIELDS}))
        except CandidateError as exc:
            raise CandidateError(f"candidate {n}: {exc}") from None
    return out


def from_proposal(proposal: Proposal, model: str) -> dict[str, Any]:
    """A model's proposal as a candidate, in the model image's frame (as the live page draws it)."""
    return candidate(
        thought=proposal.thought, action_text=proposal.action_text, raw=proposal.raw, error=proposal.error, model=model
    )


def to_screen(shown: dict[str, Any], mapping: ScreenMapping) -> dict[str, Any]:
    """A model-frame candidate in screen pixels, as a step stores it. An invalid one keeps only its raw text and
    error: its points may lie off the model image, where no screen pixel matches them."""
    if shown["error"]:
        return candidate(thought=shown["thought"], raw=shown["raw"], error=shown["error"], model=shown["model"])
    actions = map_points(parse_actions(shown["action_text"]), mapping.to_screen)
    return candidate(
        thought=shown["thought"], action_text=format_actions(actions), raw=shown["raw"], model=shown["model"]
    )
