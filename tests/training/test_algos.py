"""The RL math against reference loops and the properties the papers state."""

from __future__ import annotations

import math

import pytest
import torch

from training import algos


def naive_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE over the generated tokens only: the sequence with observation tokens cut out."""
    out = torch.zeros_like(values)
    for b in range(rewards.shape[0]):
        idx = [t for t in range(rewards.shape[1]) if mask[b, t]]
        running, next_value = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            running = delta + gamma * (lam[b] if isinstance(lam, torch.Tensor) else lam) * running
            out[b, t] = running
            next_value = values[b, t]
    return out


def batch(seed=0, b=4, t=24):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=g) > 0.35).float()
    mask[:, 0] = 1
    rewards = torch.zeros(b, t)
    for i in range(b):  # a reward on the last generated token of the trajectory and on a mid turn
        gen = mask[i].nonzero().flatten()
        rewards[i, gen[-1]] = float(torch.rand(1, generator=g))
        rewards[i, gen[len(gen) // 2]] = 0.1
    return rewards, torch.randn(b, t, generator=g), mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (0.9, 0.0), (1.0, 1.0)])
def test_gae_matches_a_naive_loop_over_the_generated_tokens(gamma, lam):
    rewards, values, mask = batch()
    advantages, returns = algos.gae(rewards, values, mask, gamma, lam)
    expected = naive_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(advantages * mask, expected * mask, atol=1e-5)
    assert torch.allclose(returns, advantages + values)


def test_per_sequence_lambda_matches_the_loop_too():
    rewards, values, mask = batch(seed=3)
    lam = algos.length_adaptive_lambda(mask, alpha=0.2)
    advantages, _ = algos.gae(rewards, values, mask, 1.0, lam)
    assert torch.allclose(advantages * mask, naive_gae(rewards, values, mask, 1.0, lam) * mask, atol=1e-5)


def test_lambda_and_gamma_one_give_the_reward_to_go():
    rewards, values, mask = batch(seed=1)
    _, returns = algos.gae(rewards, values, mask, 1.0, 1.0)
    to_go = torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1])
    assert torch.allclose(returns * mask, to_go * mask, atol=1e-5)


def test_critic_targets_do_not_depend_on_lambda_policy():
    rewards, values, mask = batch(seed=2)
    adv_a, ret_a = algos.decoupled_gae(rewards, values, mask, lam_policy=0.3)
    adv_b, ret_b = algos.decoupled_gae(rewards, values, mask, lam_policy=0.99)
    assert torch.equal(ret_a, ret_b) and not torch.allclose(adv_a, adv_b)


def test_masked_positions_do_not_change_the_advantages_of_generated_tokens():
    rewards, values, mask = batch(seed=4)
    advantages, _ = algos.gae(rewards, values, mask, 0.99, 0.95)
    noisy_values = torch.where(mask.bool(), values, torch.randn_like(values) * 100)
    noisy_rewards = torch.where(mask.bool(), rewards, torch.randn_like(rewards) * 100)
    again, _ = algos.gae(noisy_rewards, noisy_values, mask, 0.99, 0.95)
    assert torch.allclose(advantages * mask, again * mask, atol=1e-4)


def test_length_adaptive_lambda_is_clamped():
    mask = torch.zeros(3, 400)
    mask[0, :10], mask[1, :100], mask[2, :400] = 1, 1, 1
    lam = algos.length_adaptive_lambda(mask, alpha=0.05)
    assert (
        lam[0] == 0.0
        and math.isclose(float(lam[1]), 0.8, rel_tol=1e-6)
        and math.isclose(float(lam[2]), 0.95, rel_tol=1e-6)
    )


def test_clip_higher_gradients_vanish_exactly_outside_the_asymmetric_range():
    ratios = torch.tensor([0.5, 0.79, 0.81, 1.0, 1.27, 1.29, 2.0])
    for sign in (1.0, -1.0):
        log_probs = torch.log(ratios).clone().requires_grad_(True)
        advantages = torch.full_like(ratios, sign)
        loss, _ = algos.policy_loss(log_probs, torch.zeros_like(ratios), advantages, torch.ones_like(ratios),
                                    eps_low=0.2, eps_high=0.28, dual_clip=None)  # fmt: skip
        loss.backward()
        live = log_probs.grad != 0
        if sign > 0:  # positive advantage: clipped above 1 + ε_high only
            assert live.tolist() == [True, True, True, True, True, False, False]
        else:  # negative advantage: clipped below 1 − ε_low only
            assert live.tolist() == [False, False, True, True, True, True, True]


def test_dual_clip_caps_the_loss_of_negative_advantages():
    log_probs = torch.log(torch.tensor([5.0, 1.0])).requires_grad_(True)
    advantages = torch.tensor([-1.0, -1.0])
    loss, stats = algos.policy_loss(log_probs, torch.zeros(2), advantages, torch.ones(2), dual_clip=3.0)
    assert math.isclose(float(loss.detach()), (3.0 + 1.0) / 2) and stats["dual_clip_fraction"] == 0.5
    loss.backward()
    assert log_probs.grad[0] == 0 and log_probs.grad[1] != 0


def test_token_mean_uses_the_global_token_count():
    values, mask = torch.ones(2, 3), torch.tensor([[1.0, 1, 0], [1, 0, 0]])
    assert float(algos.token_mean(values, mask)) == 1.0
    assert float(algos.token_mean(values, mask, global_tokens=6)) == 0.5


GROUPS = [[1, 0, 0, 1, 0, 0, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1, 0]]


@pytest.mark.parametrize(("outcomes", "k"), [(g, k) for g in GROUPS for k in (1, 2, 3) if k <= len(g)])
def test_pass_at_k_sums_to_zero_per_group(outcomes, k):
    r = torch.tensor(outcomes, dtype=torch.float32)
    advantages = algos.pass_at_k_advantages(r, torch.zeros(len(r), dtype=torch.long), k)
    assert abs(float(advantages.sum())) < 1e-5


def test_pass_at_k_needs_k_within_the_group():
    with pytest.raises(ValueError, match="between 1 and the group size 2"):
        algos.pass_at_k_advantages(torch.tensor([1.0, 0.0]), torch.zeros(2, dtype=torch.long), 3)


def test_pass_at_1_is_grpo():
    r = torch.tensor([1, 0, 0, 1, 0, 1, 1, 1, 0, 0], dtype=torch.float32)
    groups = torch.tensor([0] * 6 + [1] * 4)
    assert torch.allclose(algos.pass_at_k_advantages(r, groups, 1), algos.grpo_advantages(r, groups), atol=1e-4)


def test_value_loss_clipping_and_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3)
    assert algos.explained_variance(returns, returns, mask) == 1.0
    assert algos.explained_variance(torch.full_like(returns, 2.0), returns, mask) == 0.0
    old, new = torch.zeros(1, 3), torch.tensor([[1.0, 2.0, 3.0]])
    clipped = algos.value_loss(new, old, returns, mask, clip=0.2)
    assert float(clipped) > float(algos.value_loss(new, old, returns, mask, clip=None)) == 0.0


def test_kl_estimators_are_zero_at_equal_policies_and_positive_otherwise():
    a, b = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    for kind in ("kl", "mse", "low_var_kl"):
        assert torch.all(algos.kl_penalty(a, a, kind) == 0)
    assert torch.all(algos.kl_penalty(a, b, "low_var_kl") > 0)
    with pytest.raises(ValueError, match="unknown KL"):
        algos.kl_penalty(a, b, "nope")
