"""Checkpoints: a save/load round trip restores weights, optimizer and RNG states; a tampered file cannot run code."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from training import checkpoints


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model[0].bias.requires_grad_(False)  # frozen: not saved, as with a LoRA base
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        model(torch.randn(5, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_a_checkpoint_restores_weights_optimizer_and_rng_states(tmp_path):
    model, optimizer = trained(0)
    saved = checkpoints.save(tmp_path, 3, models={"m": model}, optimizers={"m": optimizer}, state={"episodes": 12})
    torch_next, python_next = torch.rand(3), random.random()
    fresh, fresh_optimizer = trained(1)
    state = checkpoints.load(saved, models={"m": fresh}, optimizers={"m": fresh_optimizer})
    assert state == {"step": 3, "episodes": 12}
    assert torch.equal(torch.rand(3), torch_next) and random.random() == python_next
    for (name, a), b in zip(model.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b) or name == "0.bias"
    kept, restored = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert kept["param_groups"] == restored["param_groups"]
    for key, value in kept["state"].items():
        assert all(torch.equal(value[k], restored["state"][key][k]) for k in ("step", "exp_avg", "exp_avg_sq"))


class RunsCode:
    """An object whose unpickling calls `open(marker, "w")`: what a tampered checkpoint could do with any callable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("file", ["rng.pt", "optimizers.pt", "models.pt"])
def test_resuming_from_a_tampered_checkpoint_refuses_it_without_running_its_code(tmp_path, file):
    model, optimizer = trained(0)
    saved = checkpoints.save(tmp_path / "run", 1, models={"m": model}, optimizers={"m": optimizer}, state={})
    marker = tmp_path / "code-ran"
    torch.save({"m": RunsCode(marker), "torch": RunsCode(marker), "python": RunsCode(marker)}, saved / file)
    with pytest.raises(ValueError, match=f"{file}: holds more than tensors and plain values"):
        checkpoints.load(saved, models={"m": model}, optimizers={"m": optimizer})
    assert not marker.exists()
