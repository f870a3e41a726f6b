"""CT/SFT: learning, exact resume, LoRA, and data parallelism under torchrun (gloo) matching one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.data import read_episodes
from training.metrics import read_metrics
from training.models import LoraSettings
from training.sft import SFTConfig, content_key, episode_batches, train_sft

ROOT = Path(__file__).resolve().parents[2]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "final" / "model.safetensors")


def test_sft_lowers_the_loss_and_writes_a_loadable_checkpoint(tiny_text, demos, tmp_path):
    cfg = SFTConfig(model=str(tiny_text), data=str(demos), out=str(tmp_path / "run"), lr=3e-3, batch_episodes=16,
                    micro_batch=4, max_steps=12, progress=False)  # fmt: skip
    result = train_sft(cfg)
    losses = [r["loss"] for r in read_metrics(tmp_path / "run")]
    assert result["step"] == 12 and losses[-1] < 0.5 * losses[0]
    assert (tmp_path / "run" / "final" / "config.json").is_file() and (tmp_path / "run" / "tb").is_dir()


def test_micro_batch_size_does_not_change_the_result(tiny_text, demos, tmp_path):
    runs = {}
    for micro in (16, 3):
        cfg = SFTConfig(model=str(tiny_text), data=str(demos), out=str(tmp_path / f"m{micro}"), lr=1e-3,
                        batch_episodes=16, micro_batch=micro, max_steps=2, progress=False)  # fmt: skip
        train_sft(cfg)
        runs[micro] = weights(tmp_path / f"m{micro}")
    for name, tensor in runs[16].items():
        torch.testing.assert_close(tensor, runs[3][name], rtol=1e-4, atol=1e-5)


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tiny_text, demos, tmp_path):
    common = {"model": str(tiny_text), "data": str(demos), "lr": 1e-3, "batch_episodes": 8, "progress": False}
    train_sft(SFTConfig(out=str(tmp_path / "straight"), max_steps=4, **common))
    train_sft(SFTConfig(out=str(tmp_path / "split"), max_steps=2, **common))
    state = json.loads((tmp_path / "split" / "checkpoint-2" / "state.json").read_text())
    assert state == {"step": 2, "consumed": 16}
    train_sft(SFTConfig(out=str(tmp_path / "split"), max_steps=4, resume=True, **common))
    straight, split = weights(tmp_path / "straight"), weights(tmp_path / "split")
    for name, tensor in straight.items():
        torch.testing.assert_close(tensor, split[name])
    steps = [r["step"] for r in read_metrics(tmp_path / "split")]
    assert steps == [1, 2, 3, 4]


def relaid(source: Path, target: Path) -> Path:
    """The same episodes stored as another export would: in reverse order, under other ids."""
    episodes = list(read_episodes(source))[::-1]
    lines = [replace(e, id=f"other-{n}").to_json() for n, e in enumerate(episodes)]
    target.write_text("\n".join(lines) + "\n")
    return target


def test_shuffled_batches_depend_on_the_episodes_not_on_how_the_store_lays_them_out(demos, tmp_path):
    other = relaid(demos, tmp_path / "other.jsonl")
    assert [e.id for e in read_episodes(other)][:1] != [e.id for e in read_episodes(demos)][:1]

    def keys(path: Path, skip: int = 0) -> list[list[str]]:
        return [[content_key(e) for e in batch] for batch in episode_batches(str(path), 16, 2, skip, shuffle_seed=7)]

    ordered = keys(demos)
    assert ordered == keys(other)  # layout and ids do not matter
    flat = [k for batch in ordered for k in batch]
    first, second = flat[:256], flat[256:]
    assert sorted(first) == sorted(second) == sorted(content_key(e) for e in read_episodes(demos))
    assert first != second  # each epoch has its own order
    assert [k for batch in keys(demos, skip=40) for k in batch] == flat[40:]  # a resumed run goes on the same way
    in_file_order = [content_key(e) for batch in episode_batches(str(demos), 16, 1, 0) for e in batch]
    assert in_file_order == [content_key(e) for e in read_episodes(demos)] != first


def test_with_shuffle_the_same_data_in_another_layout_trains_the_same_model(tiny_text, demos, tmp_path):
    other = relaid(demos, tmp_path / "other.jsonl")
    common = {"model": str(tiny_text), "lr": 1e-3, "batch_episodes": 8, "max_steps": 2, "shuffle": True}
    train_sft(SFTConfig(data=str(demos), out=str(tmp_path / "a"), progress=False, **common))
    train_sft(SFTConfig(data=str(other), out=str(tmp_path / "b"), progress=False, **common))
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=0, atol=0)


def test_lora_trains_adapters_only_and_saves_merged_weights(tiny_text, demos, tmp_path):
    cfg = SFTConfig(model=str(tiny_text), data=str(demos), out=str(tmp_path / "lora"), lr=1e-2, batch_episodes=16,
                    max_steps=3, lora=LoraSettings(r=4, alpha=8), progress=False)  # fmt: skip
    train_sft(cfg)
    saved = torch.load(tmp_path / "lora" / "checkpoint-3" / "models.pt", weights_only=True)["model"]
    assert saved and all("lora_" in name for name in saved)
    merged, base = weights(tmp_path / "lora"), load_file(tiny_text / "model.safetensors")
    assert set(merged) == set(base)  # a plain checkpoint: the policy server loads it like any other
    assert any(not torch.equal(merged[n], base[n]) for n in base)


def _run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def test_two_torchrun_processes_give_the_loss_and_weights_of_one(tiny_text, demos, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    flags = ["sft", "--model", str(tiny_text), "--data", str(demos), "--lr", "1e-3", "--batch-episodes", "12",
             "--micro-batch", "2", "--max-steps", "3", "--no-progress"]  # fmt: skip
    _run([sys.executable, "-m", "training", *flags, "--out", str(tmp_path / "one")], env)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517"]
    _run([*torchrun, "-m", "training", *flags, "--out", str(tmp_path / "two")], env)
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert len(one) == len(two) == 3
    for a, b in zip(one, two, strict=True):
        assert a["trained_tokens"] == b["trained_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, tensor in weights(tmp_path / "one").items():
        torch.testing.assert_close(tensor, weights(tmp_path / "two")[name], rtol=1e-4, atol=1e-5)
