"""Balancer partitions and parameter-interpolation merges."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from training.balance import imbalance, karmarkar_karp, naive_split, post_balance, workload
from training.merge import MergeError, merge_checkpoints, merge_state_dicts


@pytest.mark.parametrize("parts", [1, 2, 8])
def test_every_item_lands_in_exactly_one_group(parts):
    rng = random.Random(parts)
    weights = [workload(rng.randint(16, 4096)) for _ in range(97)]
    groups = karmarkar_karp(weights, parts)
    assert len(groups) == parts and sorted(i for g in groups for i in g) == list(range(97))


def test_karmarkar_karp_beats_a_naive_split_on_long_tailed_lengths():
    rng = random.Random(0)
    lengths = [min(8192, int(rng.paretovariate(1.2) * 200)) for _ in range(256)]  # long tail, capped by the context
    weights = [workload(n) for n in lengths]
    balanced = imbalance(weights, karmarkar_karp(weights, 8))
    assert balanced <= 1.05 < imbalance(weights, naive_split(len(weights), 8))


def test_post_balance_moves_little_and_balances():
    rng = random.Random(1)
    per_rank = [[rng.randint(100, 3000) for _ in range(16)] for _ in range(4)]
    plan = post_balance(per_rank)
    moved = [(src, i) for group in plan for src, i in group]
    assert sorted(moved) == sorted((r, i) for r in range(4) for i in range(16))  # round trip: nothing lost
    loads = [sum(workload(per_rank[src][i]) for src, i in group) for group in plan]
    assert max(loads) / (sum(loads) / 4) <= 1.05
    assert post_balance([[500, 500], [500, 500]]) == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]  # balanced: stays put


def test_merge_is_exact_weighted_interpolation():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([4.0])}
    assert torch.equal(merge_state_dicts([a, b], [1, 0])["w"], a["w"])
    merged = merge_state_dicts([a, b], [1, 3])
    assert torch.equal(merged["w"], torch.tensor([2.5, 5.0])) and torch.equal(merged["b"], torch.tensor([3.0]))


def test_merge_refuses_checkpoints_of_different_bases(tmp_path):
    with pytest.raises(MergeError, match="different shapes"):
        merge_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}], [1, 1])
    with pytest.raises(MergeError, match="different tensors"):
        merge_state_dicts([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}], [1, 1])
    for name, hidden in [("a", 8), ("b", 16)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": hidden}))
        save_file({"w": torch.ones(2)}, str(tmp_path / name / "model.safetensors"))
    with pytest.raises(MergeError, match="hidden_size"):
        merge_checkpoints([tmp_path / "a", tmp_path / "b"], [1, 1], tmp_path / "out")


def test_merge_checkpoints_writes_a_loadable_checkpoint(tmp_path):
    for name, value in [("a", 1.0), ("b", 3.0)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
        save_file({"w": torch.full((2, 2), value)}, str(tmp_path / name / "model.safetensors"))
    out = merge_checkpoints([tmp_path / "a", tmp_path / "b"], [1, 1], tmp_path / "merged")
    assert torch.equal(load_file(str(out / "model.safetensors"))["w"], torch.full((2, 2), 2.0))
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 8
