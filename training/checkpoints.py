"""Resumable training state: `checkpoint-<step>/` holds the trainable weights, the optimizer states, the RNG states and
a `state.json` (step, episodes consumed, ...). Written to a temporary name and renamed, so a crash never leaves a
half checkpoint that `latest` would pick; older ones beyond `keep` are deleted. Everything is loaded with
`weights_only=True` (tensors and plain Python values only), so a tampered checkpoint cannot run code on resume."""

from __future__ import annotations

import json
import pickle
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


def _load_plain(file: Path) -> Any:
    """torch.load restricted to tensors and plain containers/numbers: unpickling never calls arbitrary code."""
    try:
        return torch.load(file, weights_only=True)
    except pickle.UnpicklingError as error:
        lines = [line for line in str(error).splitlines() if "WeightsUnpickler error:" in line] or [str(error)]
        reason = lines[0].split("WeightsUnpickler error:")[-1].split(". Please use")[0].strip()
        raise ValueError(f"{file}: holds more than tensors and plain values; refusing to load it ({reason})") from None


def load(path: Path, *, models: dict[str, torch.nn.Module], optimizers: dict[str, Any]) -> dict[str, Any]:
    """Restores weights, optimizer and RNG states in place; returns the saved `state.json`."""
    path = Path(path)
    weights = _load_plain(path / "models.pt")
    for name, model in models.items():
        _, unexpected = model.load_state_dict(weights[name], strict=False)
        if unexpected:
            raise ValueError(f"{path}: checkpoint of another model ({name}: unexpected {unexpected[:3]})")
    states = _load_plain(path / "optimizers.pt")
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(states[name])
    rng = _load_plain(path / "rng.pt")
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return json.loads((path / "state.json").read_text())
