#!/usr/bin/env python3
"""Trainer math figures (issue 5), each against a baseline measured in the same run.

- GAE on 1M tokens (256 sequences x 4096 tokens, 35 % observation tokens masked): the vectorised masked GAE of
  training/algos.py vs a per-token Python loop (timed on a slice, scaled per token).
- Balancer: max/mean estimated work per rank over 8 ranks for long-tailed sequence lengths, Karmarkar-Karp vs the
  equal-count split a plain DistributedSampler makes (goal <= 1.05).
Usage: .venv/bin/python bench/training_math.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from training import algos
from training.balance import imbalance, karmarkar_karp, naive_split, workload


def naive_loop(rewards, values, mask, gamma, lam) -> None:
    for b in range(rewards.shape[0]):
        running, next_value = 0.0, 0.0
        r, v, m = rewards[b].tolist(), values[b].tolist(), mask[b].tolist()
        for t in range(len(r) - 1, -1, -1):
            if m[t]:
                running = r[t] + gamma * next_value - v[t] + gamma * lam * running
                next_value = v[t]


def main() -> None:
    torch.manual_seed(0)
    b, t = 256, 4096
    rewards, values = torch.zeros(b, t), torch.randn(b, t)
    mask = (torch.rand(b, t) > 0.35).float()
    rewards[:, -1] = 1.0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        algos.gae(rewards, values, mask, 1.0, 0.95)
        times.append(time.perf_counter() - t0)
    fast = statistics.median(times)
    rows = 8
    t0 = time.perf_counter()
    naive_loop(rewards[:rows], values[:rows], mask[:rows], 1.0, 0.95)
    naive = (time.perf_counter() - t0) * b / rows
    print("| GAE over 1,048,576 tokens | seconds | tokens/s | vs per-token Python loop |\n|---|---|---|---|")
    baseline = f"per-token Python loop (baseline, scaled from {rows} sequences)"
    print(f"| {baseline} | {naive:.2f} | {b * t / naive:,.0f} | 1.00x |")
    print(
        f"| training.algos.gae (vectorised over the batch) | {fast:.3f} | {b * t / fast:,.0f} | {naive / fast:.1f}x |"
    )

    rng = random.Random(0)
    print("\n| lengths (8 ranks, 512 sequences) | naive split max/mean | Karmarkar-Karp max/mean | goal |")
    print("|---|---|---|---|")
    for name, draw in [
        ("uniform 64..4096", lambda: rng.randint(64, 4096)),
        ("long tail (Pareto 1.2 x 200, cap 8192)", lambda: min(8192, int(rng.paretovariate(1.2) * 200))),
        ("bimodal (80 % 256, 20 % 6000)", lambda: 256 if rng.random() < 0.8 else 6000),
    ]:
        weights = [workload(draw()) for _ in range(512)]
        t0 = time.perf_counter()
        groups = karmarkar_karp(weights, 8)
        took = (time.perf_counter() - t0) * 1000
        print(
            f"| {name} | {imbalance(weights, naive_split(512, 8)):.3f} | {imbalance(weights, groups):.4f} "
            f"({took:.1f} ms) | <= 1.05 |"
        )


if __name__ == "__main__":
    main()
