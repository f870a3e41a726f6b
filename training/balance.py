"""Balancing sequences across data-parallel ranks: Karmarkar–Karp on a length-based workload, and post-balancing.

A rank's step time follows its heaviest micro-batch, so sequences are split by estimated work, not by count:
work(L) ≈ a·L + L² (linear layers plus attention). `post_balance` is the OrchMLLM idea: after each rank has sampled
its sequences, move as few of them as possible so that every rank carries the same work.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


def workload(length: int, linear: float = 4096.0) -> float:
    """Estimated cost of one sequence of `length` tokens: a·L + L²."""
    return linear * length + float(length) * length


def karmarkar_karp(weights: Sequence[float], parts: int) -> list[list[int]]:
    """Split item indices into `parts` groups of near-equal total weight (largest differencing method, k-way).

    Every item appears in exactly one group; groups come back heaviest first."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    counter = itertools.count()
    for index, weight in enumerate(weights):
        state = [(float(weight), [index])] + [(0.0, []) for _ in range(parts - 1)]
        heapq.heappush(heap, (-float(weight), next(counter), state))
    if not heap:
        return [[] for _ in range(parts)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # The heaviest bins of one state take the lightest of the other: the differences cancel.
        merged = [(a[i][0] + b[parts - 1 - i][0], a[i][1] + b[parts - 1 - i][1]) for i in range(parts)]
        merged.sort(key=lambda bin_: bin_[0], reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(counter), merged))
    return [sorted(items) for _, items in heap[0][2]]


def imbalance(weights: Sequence[float], groups: list[list[int]]) -> float:
    """max / mean of the groups' total weights (1.0 is perfect)."""
    totals = [sum(weights[i] for i in group) for group in groups]
    mean = sum(totals) / len(totals)
    return max(totals) / mean if mean else 1.0


def naive_split(count: int, parts: int) -> list[list[int]]:
    """Contiguous equal-count chunks: what a plain DistributedSampler does."""
    size, extra = divmod(count, parts)
    groups, start = [], 0
    for rank in range(parts):
        stop = start + size + (1 if rank < extra else 0)
        groups.append(list(range(start, stop)))
        start = stop
    return groups


def post_balance(per_rank_lengths: list[list[int]], linear: float = 4096.0) -> list[list[tuple[int, int]]]:
    """Rebalance sequences that ranks already sampled. Input: each rank's sequence lengths. Output: for each rank,
    the (source rank, index at source) pairs it should train on: a Karmarkar–Karp partition whose groups are given
    to ranks so that as many sequences as possible stay where they are."""
    flat = [(rank, i, length) for rank, lengths in enumerate(per_rank_lengths) for i, length in enumerate(lengths)]
    parts = len(per_rank_lengths)
    weights = [workload(length, linear) for _, _, length in flat]
    groups = karmarkar_karp(weights, parts)
    current, start = [], 0
    for lengths in per_rank_lengths:
        current.append(list(range(start, start + len(lengths))))
        start += len(lengths)
    if imbalance(weights, current) <= imbalance(weights, groups):  # already as good: move nothing
        return [[(rank, i) for i in range(len(lengths))] for rank, lengths in enumerate(per_rank_lengths)]
    # Give each group to the rank that already holds most of it (greedy on the overlap matrix, biggest first).
    overlap = sorted(
        ((sum(flat[i][0] == rank for i in group), g, rank) for g, group in enumerate(groups) for rank in range(parts)),
        reverse=True,
    )
    owner: dict[int, int] = {}
    taken: set[int] = set()
    for _, g, rank in overlap:
        if g not in owner and rank not in taken:
            owner[g] = rank
            taken.add(rank)
    plan: list[list[tuple[int, int]]] = [[] for _ in range(parts)]
    for g, group in enumerate(groups):
        plan[owner[g]] = [(flat[i][0], flat[i][1]) for i in group]
    return plan
