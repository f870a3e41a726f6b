"""Merging vertical agents by parameter interpolation (UI-TARS-2 report 2.6): θ = Σ wᵢ θᵢ / Σ wᵢ, per tensor.

Checkpoints fine-tuned from one base (e.g. a browser agent and a desktop agent) are merged into one model. They must
share the architecture and every tensor's name and shape; a mismatch is refused with the offending tensor named.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ARCHITECTURE_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size")


class MergeError(ValueError):
    """The checkpoints cannot be merged (different bases, tensors or shapes)."""


def merge_state_dicts(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Weighted mean of each tensor, computed in float64 and cast back to the first checkpoint's dtype."""
    if len(states) != len(weights) or not states:
        raise MergeError("give one weight per checkpoint, and at least one checkpoint")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise MergeError("weights must be non-negative and not all zero")
    names = set(states[0])
    for n, state in enumerate(states[1:], start=2):
        if set(state) != names:
            missing = sorted(names ^ set(state))[:5]
            raise MergeError(f"checkpoint {n} has different tensors than checkpoint 1: {missing}")
    total = float(sum(weights))
    merged = {}
    for name in sorted(names):
        shapes = {tuple(state[name].shape) for state in states}
        if len(shapes) > 1:
            raise MergeError(f"tensor {name!r} has different shapes: {sorted(shapes)}")
        acc = sum(w * state[name].to(torch.float64) for w, state in zip(weights, states, strict=True))
        merged[name] = (acc / total).to(states[0][name].dtype)
    return merged


def check_same_base(configs: list[dict]) -> None:
    first = configs[0]
    for n, config in enumerate(configs[1:], start=2):
        for key in ARCHITECTURE_KEYS:
            if config.get(key) != first.get(key):
                raise MergeError(
                    f"checkpoint {n} differs from checkpoint 1 in {key}: {config.get(key)} != {first.get(key)}"
                )


def merge_checkpoints(paths: list[Path], weights: list[float], out: Path) -> Path:
    """Merge saved transformers checkpoints (config.json + model.safetensors) into `out`; tokenizer and other files
    are copied from the first checkpoint."""
    configs = [json.loads((Path(p) / "config.json").read_text()) for p in paths]
    check_same_base(configs)
    merged = merge_state_dicts([load_file(str(Path(p) / "model.safetensors")) for p in paths], weights)
    out.mkdir(parents=True, exist_ok=True)
    for item in Path(paths[0]).iterdir():
        if item.is_file() and item.name != "model.safetensors":
            shutil.copy2(item, out / item.name)
    save_file(merged, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "merge.json").write_text(json.dumps({"sources": [str(p) for p in paths], "weights": weights}, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--weights", type=float, nargs="+", help="one per checkpoint (default: equal)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    weights = args.weights or [1.0] * len(args.checkpoints)
    print(merge_checkpoints(args.checkpoints, weights, args.out))


if __name__ == "__main__":
    main()
