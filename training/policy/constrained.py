"""Grammar-constrained decoding for transformers: only tokens that keep the output a prefix of the regex survive.

Uses the `regex` package's partial matching. Tokens are grouped by first character so that a large vocabulary costs
one check per distinct first character plus one per surviving token.
"""

from __future__ import annotations

from collections import defaultdict

import regex
import torch


class RegexLogitsProcessor:
    """A transformers logits processor: masks to -inf every token that would leave the language of `pattern`;
    end-of-sequence is allowed only once the text is a full match (so every finished output matches). `pattern` may
    be one per prompt (None: that prompt is free); a prompt's `num_return_sequences` rows share its pattern."""

    def __init__(
        self, pattern: str | list[str | None], token_strings: list[str], eos_token_id: int, prompt_length: int
    ) -> None:
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        self.patterns = [None if p is None else regex.compile(p) for p in patterns]
        self.token_strings, self.eos, self.prompt_length = token_strings, eos_token_id, prompt_length
        self.by_first: dict[str, list[int]] = defaultdict(list)
        for token_id, text in enumerate(token_strings):
            if text:
                self.by_first[text[0]].append(token_id)

    def allowed(self, text: str, pattern: regex.Pattern[str] | None = None) -> list[int]:
        pattern = pattern or self.patterns[0]
        allowed = [self.eos] if pattern.fullmatch(text) else []
        for first, token_ids in self.by_first.items():
            if not pattern.fullmatch(text + first, partial=True):
                continue
            for token_id in token_ids:
                piece = self.token_strings[token_id]
                if len(piece) == 1 or pattern.fullmatch(text + piece, partial=True):
                    allowed.append(token_id)
        return allowed or [self.eos]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        mask = torch.zeros_like(scores)
        rows = input_ids.shape[0]
        per_prompt = max(rows // len(self.patterns), 1)
        for row, ids in enumerate(input_ids[:, self.prompt_length :].tolist()):
            pattern = self.patterns[min(row // per_prompt, len(self.patterns) - 1)]
            if pattern is None:
                continue
            text = "".join(self.token_strings[i] for i in ids if i != self.eos)
            mask[row] = float("-inf")
            mask[row, self.allowed(text, pattern)] = 0.0
        return scores + mask


def token_strings(tokenizer, vocab_size: int) -> list[str]:  # type: ignore[no-untyped-def]
    """The text each of the model's `vocab_size` token ids adds when decoded alone; special and padding ids map
    to '' (never proposed)."""
    special = set(tokenizer.all_special_ids)
    size = vocab_size
    out = []
    for token_id in range(size):
        known = token_id < len(tokenizer) and token_id not in special
        out.append(tokenizer.decode([token_id], skip_special_tokens=False) if known else "")
    return out
