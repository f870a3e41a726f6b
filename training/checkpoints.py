"""Resumable training state: `checkpoint-<step>/` holds the trainable weights, the optimizer states, the RNG states and
a `state.json` (step, episodes consumed, ...). Written to a temporary name and renamed, so a crash never leaves a
half checkpoint that `latest` would pick; older ones beyond `keep` are deleted."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch


def _trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only what training changes (with LoRA: the adapters, not the frozen base)."""
    return {k: v.detach().cpu().clone() for k, v in model.named_parameters() if v.requires_grad}


def save(out_dir: Path, step: int, *, models: dict[str, torch.nn.Module], optimizers: dict[str, Any],
         state: dict[str, Any], keep: int = 2) -> Path:  # fmt: skip
    out_dir = Path(out_dir)
    final = out_dir / f"checkpoint-{step}"
    tmp = out_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save({name: _trainable(m) for name, m in models.items()}, tmp / "models.pt")
    torch.save({name: o.state_dict() for name, o in optimizers.items()}, tmp / "optimizers.pt")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(out_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest(out_dir: Path) -> Path | None:
    found = sorted(Path(out_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def load(path: Path, *, models: dict[str, torch.nn.Module], optimizers: dict[str, Any]) -> dict[str, Any]:
    """Restores weights, optimizer and RNG states in place; returns the saved `state.json`."""
    weights = torch.load(path / "models.pt", weights_only=True)
    for name, model in models.items():
        _, unexpected = model.load_state_dict(weights[name], strict=False)
        if unexpected:
            raise ValueError(f"{path}: checkpoint of another model ({name}: unexpected {unexpected[:3]})")
    states = torch.load(path / "optimizers.pt", weights_only=False)
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(states[name])
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return json.loads((path / "state.json").read_text())
