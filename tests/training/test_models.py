"""Token log-probabilities computed on the trained positions alone equal the full computation, gradients included."""

from __future__ import annotations

import pytest
import torch

from training.data import Episode, Renderer, collate
from training.models import LoraSettings, load_actor, load_tokenizer, token_log_probs

EPISODES = [
    Episode(messages=[{"role": "user", "content": "abc"}, {"role": "assistant", "content": "abc"}], id="a"),
    Episode(
        messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "xy"},
            {"role": "user", "content": "longer observation"},
            {"role": "assistant", "content": "z"},
        ],
        id="b",
    ),
]


def _batch(path):
    tokenizer, _ = load_tokenizer(path)
    batch = collate([Renderer(tokenizer).render(e) for e in EPISODES], tokenizer.pad_token_id)
    return batch, batch["loss_mask"][:, 1:]


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (older or custom models): the fallback path."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, use_cache=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)


@pytest.mark.parametrize("variant", ["plain", "lora", "no_logits_to_keep"])
def test_trained_positions_only_match_the_full_computation(tiny_text, variant):
    torch.manual_seed(0)
    model = load_actor(tiny_text, LoraSettings(r=4) if variant == "lora" else None)
    if variant == "no_logits_to_keep":
        model = _NoLogitsToKeep(model)
    batch, mask = _batch(tiny_text)
    full, full_entropy = token_log_probs(model, batch, entropy=True)
    full_loss = -(full * mask).sum() - (full_entropy * mask).sum()
    full_loss.backward()
    full_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)

    kept, kept_entropy = token_log_probs(model, batch, only=mask, entropy=True)
    assert kept.shape == full.shape and kept_entropy is not None
    torch.testing.assert_close(kept, full * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kept_entropy, full_entropy * mask, rtol=1e-5, atol=1e-5)
    assert (kept[mask == 0] == 0).all()
    (-(kept * mask).sum() - (kept_entropy * mask).sum()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    for got, want in zip(grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_entropy_as_a_metric_stays_out_of_the_graph(tiny_text):
    model = load_actor(tiny_text)
    batch, mask = _batch(tiny_text)
    log_probs, entropy = token_log_probs(model, batch, only=mask, entropy=True, entropy_grad=False)
    assert log_probs.requires_grad and entropy is not None and not entropy.requires_grad
    assert (entropy[mask.bool()] > 0).all()
