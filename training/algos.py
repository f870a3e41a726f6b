"""The RL math of the trainer as pure functions over `(batch, T)` tensors with masks (UI-TARS-2 report, 2.5–2.6).

Conventions (as in verl's core_algos): `mask` is 1 on tokens the policy generated and 0 on prompt, observation,
environment and padding tokens; rewards sit on the last generated token of a turn; losses are token means over the
*global* batch, so pass `global_tokens` when the batch is split across data-parallel ranks.
Sources: PPO/GAE (Schulman et al.), VC-PPO 2503.01491 (decoupled GAE, value pretraining), VAPO 2504.05118
(length-adaptive λ), DAPO 2503.14476 (clip-higher, token-mean, overlong shaping), Pass@k training 2508.10751.
"""

from __future__ import annotations

import math

import torch

LOG_RATIO_CLAMP = 20.0  # |log π/π_old| and |log π_ref/π| before exp, as in verl's core_algos: exp(20) ≈ 4.9e8 is finite


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE that skips masked tokens: through an observation the next value and the running advantage are
    carried unchanged, so a turn's last action token bootstraps from the first action token of the next turn.

    rewards, values, mask: (B, T); lam: a float or (B,) per sequence. Returns (advantages, returns), both (B, T);
    returns = advantages + values are the critic's targets. Values at masked positions are never used.
    """
    batch, length = rewards.shape
    lam_t = torch.as_tensor(lam, dtype=values.dtype, device=values.device).expand(batch)
    mask = mask.to(values.dtype)
    # The value each token bootstraps from: that of the next *generated* token (0 after the last one).
    positions = torch.arange(length, device=values.device).expand(batch, length)
    generated_at = torch.where(mask > 0, positions, torch.full_like(positions, length))
    following = torch.flip(torch.cummin(torch.flip(generated_at, [1]), dim=1).values, [1])
    following = torch.cat([following[:, 1:], torch.full_like(following[:, :1], length)], dim=1)
    padded = torch.cat([values, torch.zeros_like(values[:, :1])], dim=1)
    next_values = padded.gather(1, following)
    # running_t = m_t·(δ_t + γλ·running_{t+1}) + (1 − m_t)·running_{t+1}: one multiply-add per step.
    masked_deltas = (mask * (rewards + gamma * next_values - values)).T.contiguous()
    decay = (mask * (gamma * lam_t)[:, None] + (1 - mask)).T.contiguous()
    advantages_t = torch.empty_like(masked_deltas)
    running = torch.zeros(batch, dtype=values.dtype, device=values.device)
    for t in range(length - 1, -1, -1):
        running = torch.addcmul(masked_deltas[t], decay[t], running)
        advantages_t[t] = running
    advantages = advantages_t.T
    return advantages, advantages + values


def length_adaptive_lambda(mask: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    """VAPO's λ_policy = 1 − 1/(α·l) per sequence, l = number of generated tokens, clamped to [0, 1]."""
    lengths = mask.sum(dim=-1).to(torch.float32).clamp(min=1.0)
    return (1.0 - 1.0 / (alpha * lengths)).clamp(0.0, 1.0)


def decoupled_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam_critic: float = 1.0,
    lam_policy: float | torch.Tensor = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled GAE (VC-PPO): actor advantages with λ_policy, critic targets with λ_critic (1.0 = Monte Carlo).

    Returns (advantages for the actor, returns for the critic)."""
    advantages, _ = gae(rewards, values, mask, gamma, lam_policy)
    _, returns = gae(rewards, values, mask, gamma, lam_critic)
    return advantages, returns


def grpo_advantages(outcomes: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each outcome minus its group's mean, over the group's population std. outcomes, groups: (N,)."""
    out = torch.zeros_like(outcomes, dtype=torch.float32)
    for group in groups.unique():
        members = groups == group
        r = outcomes[members].to(torch.float32)
        out[members] = (r - r.mean()) / (r.std(unbiased=False) + eps) if len(r) > 1 else 0.0
    return out


def pass_at_k_advantages(outcomes: torch.Tensor, groups: torch.Tensor, k: int) -> torch.Tensor:
    """Analytical Pass@k advantages for binary outcomes (2508.10751); k = 1 is GRPO, and each group sums to 0.

    With N samples of which N_neg failed: R̄ = 1 − C(N_neg,k)/C(N,k), σ = sqrt(R̄(1−R̄)),
    A_pos = (1−R̄)/σ, A_neg = (1 − R̄ − C(N_neg−1,k−1)/C(N−1,k−1))/σ; a group with σ = 0 gets 0."""
    out = torch.zeros_like(outcomes, dtype=torch.float32)
    for group in groups.unique():
        members = groups == group
        r = outcomes[members]
        n, n_neg = len(r), int((r <= 0).sum())
        if not 1 <= k <= n:
            raise ValueError(f"k = {k} must be between 1 and the group size {n}")
        mean = 1.0 - math.comb(n_neg, k) / math.comb(n, k)
        sigma = math.sqrt(mean * (1.0 - mean))
        if sigma == 0.0:
            continue
        a_pos = (1.0 - mean) / sigma
        a_neg = (1.0 - mean - (math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1) if n_neg else 0.0)) / sigma
        out[members] = torch.where(r > 0, torch.tensor(a_pos), torch.tensor(a_neg))
    return out


def broadcast_to_tokens(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A per-sequence advantage (B,) on every generated token: (B, T)."""
    return per_sequence[:, None].to(torch.float32) * mask.to(torch.float32)


def token_mean(values: torch.Tensor, mask: torch.Tensor, global_tokens: float | None = None) -> torch.Tensor:
    """Sum over generated tokens divided by the token count of the global batch (DAPO's token-level aggregation)."""
    count = mask.sum() if global_tokens is None else torch.as_tensor(global_tokens, dtype=values.dtype)
    return (values * mask).sum() / count.clamp(min=1)


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = 3.0,
    global_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip-higher (ratio clipped to [1−ε_low, 1+ε_high]) and dual clip for negative
    advantages (loss capped at −A·c); token-mean. Returns (loss, {clip_fraction, dual_clip_fraction, approx_kl}).

    The log-ratio is clamped to ±LOG_RATIO_CLAMP before exp (as verl does): exp overflows float32 above ≈ 88, and an
    infinite ratio times a zero advantage or mask makes the loss and every gradient NaN, masked tokens included."""
    log_ratio = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    m = mask.to(loss.dtype)
    with torch.no_grad():
        count = m.sum().clamp(min=1)
        stats = {
            "clip_fraction": float(((clipped > unclipped).to(m.dtype) * m).sum() / count),
            "dual_clip_fraction": float((dual.to(m.dtype) * m).sum() / count),
            "approx_kl": float((0.5 * log_ratio**2 * m).sum() / count),
        }
    return token_mean(loss, m, global_tokens), stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    global_tokens: float | None = None,
) -> torch.Tensor:
    """½·max((V − R)², (clip(V, V_old ± c) − R)²), token-mean (no clipping when `clip` is None)."""
    loss = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * token_mean(loss, mask.to(loss.dtype), global_tokens)


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate to the reference policy: "kl" (k1), "mse" (k2) or "low_var_kl" (k3, clamped as verl's
    `kl_penalty`: ref − logp to ±LOG_RATIO_CLAMP before exp, the estimate to ±10; value and gradient stay finite)."""
    diff = log_probs - ref_log_probs
    if kind == "kl":
        return diff
    if kind == "mse":
        return 0.5 * diff**2
    if kind == "low_var_kl":
        kl = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(kl) - kl - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r} (kl, mse, low_var_kl)")


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V)/Var(R) over generated tokens: 1 is a perfect critic, ≤ 0 one no better than a constant."""
    m = mask.bool()
    r, v = returns[m].float(), values[m].float()
    var = r.var(unbiased=False)
    return float("nan") if var == 0 else float(1.0 - (r - v).var(unbiased=False) / var)
