"""The RL math against reference loops and the properties the papers state."""

from __future__ import annotations

import itertools
import math
import random

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


def brute_force_pass_at_k(outcomes: list[int], k: int) -> list[float]:
    """Pass@k training's definition by enumeration (2508.10751): every k-subset of the group is a "group" whose
    reward is the max over its members; its advantage is (max − R̄)/σ with R̄ and σ the mean and population std of
    that max over all C(N, k) subsets; a response's advantage is the mean over the C(N−1, k−1) subsets holding it."""
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    best = [max(outcomes[i] for i in s) for s in subsets]
    mean = sum(best) / len(best)
    sigma = math.sqrt(sum((b - mean) ** 2 for b in best) / len(best))
    if sigma == 0:
        return [0.0] * len(outcomes)
    out = []
    for i in range(len(outcomes)):
        holding = [(b - mean) / sigma for s, b in zip(subsets, best, strict=True) if i in s]
        out.append(sum(holding) / len(holding))
    return out


def test_pass_at_k_equals_the_brute_force_over_all_k_subsets():
    rng = random.Random(0)
    cases = [(g, k) for g in GROUPS for k in range(1, len(g) + 1)]
    for n in range(1, 8):  # every group size up to 7, every number of successes, every k
        for n_pos in range(n + 1):
            outcomes = [1] * n_pos + [0] * (n - n_pos)
            rng.shuffle(outcomes)
            cases += [(outcomes, k) for k in range(1, n + 1)]
    for outcomes, k in cases:
        r = torch.tensor(outcomes, dtype=torch.float32)
        got = algos.pass_at_k_advantages(r, torch.zeros(len(r), dtype=torch.long), k)
        assert torch.allclose(got, torch.tensor(brute_force_pass_at_k(outcomes, k)), atol=1e-5), (outcomes, k)


def test_pass_at_k_keeps_interleaved_groups_apart():
    first, second = [1, 0, 0, 1, 0], [0, 1, 1, 0, 0, 0]
    r = torch.tensor([*first, *second], dtype=torch.float32)
    groups = torch.tensor([0] * len(first) + [1] * len(second))
    order = torch.randperm(len(r), generator=torch.Generator().manual_seed(0))
    got = algos.pass_at_k_advantages(r[order], groups[order], 3)
    expected = torch.tensor(brute_force_pass_at_k(first, 3) + brute_force_pass_at_k(second, 3))[order]
    assert torch.allclose(got, expected, atol=1e-5)


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


def test_huge_log_ratios_give_finite_losses_and_gradients_even_on_masked_tokens():
    """exp overflows float32 above ≈ 88: an unclamped ratio is inf, and inf × (zero advantage or mask) is NaN."""
    log_probs = torch.tensor([[100.0, -0.1, 300.0, 0.05], [-0.2, 95.0, -500.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1, 0, 1], [1, 0, 1, 1]])
    advantages = algos.broadcast_to_tokens(torch.tensor([1.0, -1.0]), mask)  # 0 on the masked tokens
    loss, stats = algos.policy_loss(log_probs, torch.zeros_like(log_probs), advantages, mask)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(log_probs.grad).all()
    assert all(math.isfinite(v) for v in stats.values())
    assert torch.all(log_probs.grad[mask == 0] == 0)
    # The masked tokens change nothing: the same loss as with ordinary values there.
    calm = torch.where(mask.bool(), log_probs.detach(), torch.zeros_like(log_probs))
    again, _ = algos.policy_loss(calm, torch.zeros_like(calm), advantages, mask)
    assert torch.allclose(loss.detach(), again)
    # Unmasked, a huge ratio is clipped (positive advantage) or dual-clipped (negative): finite, zero gradient.
    for sign in (1.0, -1.0):
        huge = torch.tensor([120.0, 0.1], requires_grad=True)
        loss, _ = algos.policy_loss(huge, torch.zeros(2), torch.full((2,), sign), torch.ones(2))
        loss.backward()
        assert math.isfinite(float(loss.detach())) and huge.grad[0] == 0 and huge.grad[1] != 0


def verl_low_var_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """verl's `kl_penalty(..., "low_var_kl")` (verl/trainer/ppo/core_algos.py), transcribed as the reference."""
    kl = torch.clamp(ref_log_probs - log_probs, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def test_low_var_kl_and_its_gradient_match_verl_at_extreme_log_ratios():
    gaps = torch.tensor(
        [-1000.0, -100.0, -30.0, -20.0, -5.0, -0.3, 0.0, 0.3, 2.0, 5.0, 20.0, 30.0, 88.0, 100.0, 1000.0]
    )
    ref = torch.full_like(gaps, -1.0)
    ours_in, verl_in = (ref - gaps).requires_grad_(True), (ref - gaps).requires_grad_(True)  # ref − logp = gap
    ours, theirs = algos.kl_penalty(ours_in, ref, "low_var_kl"), verl_low_var_kl(verl_in, ref)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.isfinite(ours_in.grad).all() and torch.allclose(ours_in.grad, verl_in.grad, rtol=1e-5, atol=1e-6)
    assert float(ours.detach()[gaps == 100.0]) == 10.0 and float(ours_in.grad[gaps == 100.0]) == 0.0
