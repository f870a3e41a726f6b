"""Spoken words + reduced actions -> steps of thought, action and key frame.

By default the words spoken between two actions become the thought of the following action (people say what they
are about to do); `preceding` gives them to the action before instead. Either way the words after the last action
become the closing thought (the pipeline puts it on a final `finished()` step).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from .reduce import ReducedAction


class Attach(StrEnum):
    FOLLOWING = "following"  # words before an action explain it
    PRECEDING = "preceding"  # words after an action comment on it


class SpokenWord(Protocol):
    text: str
    start: float
    end: float


@dataclass
class AlignedStep:
    """One step: its action (None for the closing step) and the words that make its thought."""

    action: ReducedAction | None
    words: list[dict[str, Any]] = field(default_factory=list)  # {text, start, end} on the capture's clock

    @property
    def thought(self) -> str:
        return join_words(w["text"] for w in self.words)


def join_words(words: Sequence[str] | Any) -> str:
    """Whisper words carry their own leading spaces (or not, depending on the backend): normalise to single spaces."""
    return " ".join(text.strip() for text in words if text.strip())


def align(
    actions: list[ReducedAction],
    words: Sequence[SpokenWord],
    *,
    audio_offset: float = 0.0,
    attach: Attach | str = Attach.FOLLOWING,
) -> list[AlignedStep]:
    """Steps for `actions` plus a closing step; each word goes to one step by the midpoint of its time span.

    `audio_offset` is the time on the capture's clock at which the audio starts (session.json `audio.offset`).
    """
    attach = Attach(attach)
    steps = [AlignedStep(a) for a in actions]
    closing = AlignedStep(None)
    starts = [a.start for a in actions]
    for word in words:
        start, end = word.start + audio_offset, word.end + audio_offset
        mid = (start + end) / 2
        if attach is Attach.FOLLOWING:
            i = bisect.bisect_left(starts, mid)  # the first action starting at or after the word
            target = steps[i] if i < len(steps) else closing
        elif steps and mid > actions[-1].end:
            target = closing
        else:
            i = bisect.bisect_right(starts, mid) - 1  # the last action started before the word
            target = steps[max(i, 0)] if steps else closing
        target.words.append({"text": word.text, "start": round(start, 3), "end": round(end, 3)})
    return [*steps, closing]
