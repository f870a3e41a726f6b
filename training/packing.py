"""Padding-free batches: several sequences share a row, each with its own positions, so no work goes to padding.

Rollout lengths are long-tailed, and a right-padded batch costs B × (longest sequence) tokens in every layer. A packed
batch puts the sequences into rows as long as the longest one (first-fit decreasing), restarts `position_ids` at each
sequence and leaves `attention_mask` out; transformers then recognises the packed format from the positions and keeps
each sequence's attention to itself (block-diagonal causal mask). Per-token tensors aligned with the predicted tokens,
shape (B, T−1), are packed the same way with a zero on each sequence's last slot, which in a packed row would predict
the next sequence's first token. Results equal the padded batch's; `unpack` brings per-token outputs back.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Packing:
    """Where each sequence of a (B, T) batch went: `index` (R, L) holds the flat source position b·T + t of every slot,
    −1 for the filler at the end of a row; `positions` (R, L) the position ids the model sees."""

    index: torch.Tensor
    positions: torch.Tensor
    source_shape: tuple[int, int]

    @property
    def filled(self) -> torch.Tensor:
        return self.index >= 0

    @property
    def predicts(self) -> torch.Tensor:
        """(R, L−1): slots whose next slot holds the next token of the same sequence (the per-token positions)."""
        filled = self.filled
        return filled[:, :-1] & filled[:, 1:] & (self.positions[:, 1:] == self.positions[:, :-1] + 1)

    @property
    def efficiency(self) -> float:
        """Real tokens / slots: 1.0 when nothing is filler."""
        return float(self.filled.float().mean())


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Sequence indices grouped into rows of at most `capacity` tokens, longest first (at most 11/9 OPT + 1 rows)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > capacity:
            raise ValueError(f"sequence {i} has {lengths[i]} tokens, more than a row's {capacity}")
        row = next((r for r, space in enumerate(free) if space >= lengths[i]), None)
        if row is None:
            rows.append([])
            free.append(capacity)
            row = len(rows) - 1
        rows[row].append(i)
        free[row] -= lengths[i]
    return rows


def plan(attention_mask: torch.Tensor) -> Packing:
    """Packs a right-padded batch into rows as long as its longest sequence."""
    batch, width = attention_mask.shape
    lengths = [int(n) for n in attention_mask.sum(-1)]
    rows = first_fit_decreasing(lengths, max(lengths))
    length = max(sum(lengths[i] for i in row) for row in rows)
    index = torch.full((len(rows), length), -1, dtype=torch.long)
    positions = torch.zeros((len(rows), length), dtype=torch.long)
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            n = lengths[i]
            index[r, offset : offset + n] = torch.arange(n) + i * width
            positions[r, offset : offset + n] = torch.arange(n)
            offset += n
        positions[r, offset:] = torch.arange(length - offset)  # the filler is a sequence of its own: never attended
    device = attention_mask.device
    return Packing(index.to(device), positions.to(device), (batch, width))


def pack(batch: dict[str, torch.Tensor], packing: Packing) -> dict[str, torch.Tensor]:
    """The packed batch: `input_ids` and `position_ids` (R, L), every (B, T−1) per-token tensor as (R, L−1); the
    attention mask is dropped (the positions say where sequences start) and other keys are left out."""
    batch_size, width = packing.source_shape
    where = packing.index.clamp(min=0)
    out = {"input_ids": batch["input_ids"].reshape(-1)[where] * packing.filled, "position_ids": packing.positions}
    predicts = packing.predicts
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == (batch_size, width - 1):
            source = torch.nn.functional.pad(value, (0, 1)).reshape(-1)  # flat b·T + t indexing
            out[key] = source[where[:, :-1]] * predicts  # a sequence's last slot would predict the next one's start
    return out


def unpack(values: torch.Tensor, packing: Packing) -> torch.Tensor:
    """A packed per-token tensor (R, L−1) back to the batch's (B, T−1), zeros where the batch had padding."""
    batch_size, width = packing.source_shape
    predicts = packing.predicts
    out = torch.zeros(batch_size * width, dtype=values.dtype, device=values.device)
    out[packing.index[:, :-1][predicts]] = values[predicts]
    return out.reshape(batch_size, width)[:, :-1]


@torch.no_grad()
def exact_for(model: Any, vocab_size: int) -> bool:
    """Whether this model keeps packed sequences apart: log-probs of short random sequences, padded and packed (two
    of them in one row), agree. Packing relies on transformers recognising packed rows from `position_ids`; a model
    that does not (its attention would cross into the neighbouring sequence) fails this and is trained padded."""
    from training.models import token_log_probs

    generator = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab_size, (3, 12), generator=generator).to(device)
    attention = torch.ones_like(ids)
    attention[1:, 6:] = 0  # 12, 6 and 6 tokens: the two short ones share a row
    batch = {"input_ids": ids * attention, "attention_mask": attention, "mask": attention[:, 1:].float()}
    layout = plan(attention)
    packed_batch = pack(batch, layout)
    padded, _ = token_log_probs(model, batch, only=batch["mask"])
    packed, _ = token_log_probs(model, packed_batch, only=packed_batch["mask"])
    tolerance = 1e-3 if next(model.parameters()).dtype == torch.float32 else 5e-2
    return bool(torch.allclose(unpack(packed, layout), padded, atol=tolerance, rtol=tolerance))


def usable(wanted: bool, model: Any, vocab_size: int) -> bool:
    """Whether a trainer packs: asked for (`--pack`) and exact for this model; a model that fails the check trains
    padded, with a warning saying so."""
    if not wanted:
        return False
    if exact_for(model, vocab_size):
        return True
    warnings.warn("this model does not keep packed sequences apart; training on padded batches", stacklevel=3)
    return False
