"""Reward shaping (UI-TARS-2 2.5.3, DAPO's overlong shaping): penalties added to a rendered episode's token rewards,
each on the last token of the turn it concerns, so GAE credits the turn that earned it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.data import Sample


@dataclass
class Shaping:
    """format_penalty: per turn whose reply did not end by itself (cut at the token limit: `truncated`) or,
    with `grammar="ui-tars"`, does not parse as a UI-TARS step. max_turn_tokens/overlong_buffer/overlong_penalty:
    DAPO's soft overlong penalty, linear from 0 at (max − buffer) tokens to −overlong_penalty at max.
    step_budget/step_penalty: −step_penalty per turn beyond the budget, on the last turn (0 turns = no budget)."""

    format_penalty: float = 0.0
    grammar: str = "none"
    max_turn_tokens: int = 0
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    step_budget: int = 0
    step_penalty: float = 0.0

    def apply(self, sample: Sample) -> dict[str, float]:
        """Adds the penalties to `sample.rewards` in place; returns what was added, by kind."""
        added = {"format": 0.0, "overlong": 0.0, "steps": 0.0}
        mask = sample.loss_mask
        start = 0
        assistant = [m for m in (sample.episode.messages if sample.episode else []) if m["role"] == "assistant"]
        for n, end in enumerate(sample.turn_ends):
            first = end
            while first > start and mask[first - 1] > 0:
                first -= 1
            length = end - first + 1
            start = end + 1
            penalty = 0.0
            if self.format_penalty and n < len(assistant) and not self._well_formed(assistant[n]):
                penalty -= self.format_penalty
                added["format"] -= self.format_penalty
            if self.max_turn_tokens and self.overlong_buffer:
                limit = self.max_turn_tokens - self.overlong_buffer
                if length > limit:
                    over = min(1.0, (length - limit) / self.overlong_buffer) * self.overlong_penalty
                    penalty -= over
                    added["overlong"] -= over
            sample.rewards[end] += penalty
        if self.step_budget and len(sample.turn_ends) > self.step_budget:
            extra = self.step_penalty * (len(sample.turn_ends) - self.step_budget)
            sample.rewards[sample.turn_ends[-1]] -= extra
            added["steps"] -= extra
        return added

    def _well_formed(self, message: dict[str, Any]) -> bool:
        if message.get("truncated"):
            return False
        if self.grammar == "ui-tars":
            from sandbox.actions import ActionSyntaxError, parse_step

            try:
                parse_step(message["content"])
            except ActionSyntaxError:
                return False
        return True
