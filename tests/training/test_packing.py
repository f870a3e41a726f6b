"""Padding-free rows: the plan keeps every sequence whole within a row, packing round-trips per-token tensors, and
the models, a PPO update and an SFT step give what the padded batch gives."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from training import packing
from training.data import Episode, Renderer, collate
from training.models import Critic, load_actor, load_tokenizer, model_inputs, token_log_probs
from training.ppo import PPOConfig, PPOTrainer
from training.sft import masked_nll_sum


def _episodes(count: int, seed: int = 0) -> list[Episode]:
    """Long-tailed lengths, one and two turns, so rows mix sequences and padding would dominate a padded batch."""
    rng = random.Random(seed)
    episodes = []
    for i in range(count):
        messages = []
        for _ in range(rng.choice([1, 2])):
            size = min(int(rng.expovariate(1 / 6)) + 1, 40)
            text = "".join(rng.choice("abcdefgh") for _ in range(size))
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]
        episodes.append(Episode(messages=messages, id=f"e{i}", reward=rng.random()))
    return episodes


def _batch(path, count: int = 12):
    tokenizer, _ = load_tokenizer(path)
    batch = collate([Renderer(tokenizer).render(e) for e in _episodes(count)], tokenizer.pad_token_id)
    batch["mask"] = batch["loss_mask"][:, 1:]
    return batch


def test_first_fit_decreasing_keeps_sequences_whole_and_rows_within_capacity():
    lengths = [random.Random(1).randint(1, 50) for _ in range(200)]
    rows = packing.first_fit_decreasing(lengths, 50)
    assert sorted(i for row in rows for i in row) == list(range(200))
    assert all(sum(lengths[i] for i in row) <= 50 for row in rows)
    assert len(rows) <= 11 / 9 * sum(lengths) / 50 + 1
    with pytest.raises(ValueError, match="more than a row's 10"):
        packing.first_fit_decreasing([11], 10)


def test_pack_and_unpack_round_trip_per_token_tensors(tiny_text):
    batch = _batch(tiny_text)
    layout = packing.plan(batch["attention_mask"])
    assert layout.index.shape[1] == int(batch["attention_mask"].sum(-1).max())  # rows as long as the longest
    assert layout.index.shape[0] < batch["input_ids"].shape[0] and 0.5 < layout.efficiency <= 1.0
    values = torch.randn(batch["mask"].shape) * batch["mask"]
    packed = packing.pack(dict(batch, values=values), layout)
    assert set(packed) == {"input_ids", "position_ids", "mask", "values"}  # the (B, T) masks are dropped
    assert packed["mask"].sum() == batch["mask"].sum()
    torch.testing.assert_close(packing.unpack(packed["values"], layout), values)
    # every real token sits in exactly one slot, with its position in its own sequence
    real = batch["input_ids"][batch["attention_mask"].bool()]
    assert sorted(packed["input_ids"][layout.filled].tolist()) == sorted(real.tolist())


def test_packed_forward_passes_equal_the_padded_ones(tiny_text):
    torch.manual_seed(0)
    batch = _batch(tiny_text)
    layout = packing.plan(batch["attention_mask"])
    packed = packing.pack(batch, layout)
    actor = load_actor(tiny_text)
    padded_lp, _ = token_log_probs(actor, batch, only=batch["mask"])
    packed_lp, _ = token_log_probs(actor, packed, only=packed["mask"])
    torch.testing.assert_close(packing.unpack(packed_lp, layout), padded_lp, rtol=1e-5, atol=1e-5)
    critic = Critic.from_pretrained(tiny_text)
    torch.nn.init.normal_(critic.value_head.weight)  # a zero head would hide differences
    padded_v = critic(**model_inputs(batch))[:, :-1] * batch["mask"]
    packed_v = packing.unpack(critic(**model_inputs(packed))[:, :-1], layout) * batch["mask"]
    torch.testing.assert_close(packed_v, padded_v, rtol=1e-5, atol=1e-5)


def test_a_packed_sft_step_has_the_padded_loss_and_gradients(tiny_text):
    batch = _batch(tiny_text)
    actor = load_actor(tiny_text)
    loss = masked_nll_sum(actor, batch)  # packs text batches
    loss.backward()
    grads = [p.grad.clone() for p in actor.parameters()]
    actor.zero_grad(set_to_none=True)
    padded_lp, _ = token_log_probs(actor, batch, only=batch["mask"])
    reference = -(padded_lp * batch["mask"]).sum()
    reference.backward()
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, (p.grad for p in actor.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_ppo_update_with_packing_gives_the_padded_update(tiny_text, tmp_path):
    episodes = _episodes(16, seed=3)
    trained = {}
    for pack in (False, True):
        torch.manual_seed(0)
        cfg = PPOConfig(model=str(tiny_text), out=str(tmp_path / str(pack)), pack=pack, episodes_per_step=16,
                        ppo_epochs=2, minibatches=2, actor_lr=1e-3, critic_lr=1e-3, kl_coef=0.1, streaming=False,
                        progress=False)  # fmt: skip
        trainer = PPOTrainer(cfg)
        batch = trainer.prepare(episodes)
        stats = trainer.update(batch)
        trained[pack] = (copy.deepcopy(batch), stats, trainer.actor.state_dict(), trainer.critic.state_dict())
    (padded, padded_stats, padded_actor, padded_critic), (packed, packed_stats, packed_actor, packed_critic) = (
        trained[False],
        trained[True],
    )
    for key in ("old_log_probs", "ref_log_probs", "values", "advantages", "returns"):
        torch.testing.assert_close(packed[key], padded[key], rtol=1e-4, atol=1e-5, msg=key)
    assert packed_stats["policy_loss"] == pytest.approx(padded_stats["policy_loss"], rel=1e-3, abs=1e-6)
    for name, value in padded_actor.items():
        torch.testing.assert_close(packed_actor[name], value, rtol=1e-4, atol=1e-5, msg=name)
    for name, value in padded_critic.items():
        torch.testing.assert_close(packed_critic[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_models_that_would_mix_packed_sequences_are_found_and_trained_padded(tiny_text):
    """GPT-2 ignores per-sequence positions for its attention mask (plain causal attention over the row); the check
    sees its packed log-probs differ and the trainers keep such models padded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer, _ = load_tokenizer(tiny_text)
    assert packing.exact_for(load_actor(tiny_text), len(tokenizer))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=300, bos_token_id=0, eos_token_id=0))
    assert not packing.exact_for(gpt2, 300)
