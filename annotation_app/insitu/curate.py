"""Curation of captures: flags for sessions too short or empty to use, and near-duplicate detection by screens and
action sequences (the same annotator recording the same thing twice, or a re-upload under a new session id)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from sandbox.actions import Hotkey, Scroll, Type, action_points

from .reduce import ReducedAction

GRID = 16  # action positions are compared on a 16×16 grid, so a click a few pixels off still matches
HASH_NEAR = 6  # dHash bits that may differ for two screens to count as the same


@dataclass(frozen=True)
class Thresholds:
    min_seconds: float = 5.0
    min_actions: int = 2
    min_words: int = 3
    duplicate_actions: float = 0.9  # action-sequence similarity (0..1) ...
    duplicate_screens: float = 0.8  # ... and share of screens with a near match, both needed for a duplicate


def dhash(path: Path) -> int:
    """64-bit difference hash of a screenshot: robust to compression and small changes, cheap (a 9×8 thumbnail).
    Hand-written (ten lines) rather than pulling in `imagehash` and its SciPy dependency."""
    with Image.open(path) as image:
        small = image.convert("L").resize((9, 8), Image.Resampling.BILINEAR)
        pixels = small.tobytes()
    bits = 0
    for row in range(8):
        for col in range(8):
            bits = (bits << 1) | (pixels[row * 9 + col] < pixels[row * 9 + col + 1])
    return bits


def action_token(reduced: ReducedAction, width: int, height: int) -> str:
    action = reduced.action
    token = action.name
    points = action_points(action)
    if points:
        token += "@" + ",".join(f"{int(p.x * GRID / width)}:{int(p.y * GRID / height)}" for p in points)
    if isinstance(action, Type):
        token += ":" + action.content
    elif isinstance(action, Hotkey):
        token += ":" + "+".join(action.keys)
    elif isinstance(action, Scroll):
        token += ":" + action.direction
    return token


def signature(actions: list[ReducedAction], frame_hashes: list[int], width: int, height: int) -> dict[str, Any]:
    """What near-duplicate detection compares, small enough to keep on the capture's row."""
    return {
        "actions": [action_token(a, width, height) for a in actions],
        "screens": [f"{h:016x}" for h in frame_hashes],
    }


def similarity(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """(action-sequence similarity, share of a's screens with a near match in b), each 0..1."""
    actions = difflib.SequenceMatcher(None, a.get("actions", []), b.get("actions", []), autojunk=False).ratio()
    mine = [int(h, 16) for h in a.get("screens", [])]
    theirs = [int(h, 16) for h in b.get("screens", [])]
    if not mine or not theirs:
        return actions, 0.0
    near = sum(1 for h in mine if any((h ^ g).bit_count() <= HASH_NEAR for g in theirs))
    return actions, near / len(mine)


def is_near_duplicate(a: dict[str, Any], b: dict[str, Any], thresholds: Thresholds = Thresholds()) -> bool:
    actions, screens = similarity(a, b)
    if not a.get("actions") and not b.get("actions"):
        return False
    return actions >= thresholds.duplicate_actions and screens >= thresholds.duplicate_screens


def quality_flags(duration: float, actions: int, words: int, thresholds: Thresholds = Thresholds()) -> list[str]:
    """Flags the annotator and the data lead see; none of them blocks a submission by itself."""
    flags = []
    if actions == 0:
        flags.append("no_actions")
    elif actions < thresholds.min_actions:
        flags.append("too_few_actions")
    if duration < thresholds.min_seconds:
        flags.append("too_short")
    if words == 0:
        flags.append("no_speech")
    elif words < thresholds.min_words:
        flags.append("little_speech")
    return flags
