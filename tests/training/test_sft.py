"""CT/SFT: learning, exact resume, LoRA, and data parallelism under torchrun (gloo) matching one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.metrics import read_metrics
from training.models import LoraSettings
from training.sft import SFTConfig, train_sft

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
