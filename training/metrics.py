"""Training metrics: one JSON line per step (`metrics.jsonl`) and TensorBoard event files (`tb/`), written by rank 0
only; `plot` draws chosen curves to a PNG so a run can be judged at a glance."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

PLOT_KEYS = ("reward", "entropy", "explained_variance")


class MetricsLogger:
    def __init__(self, out_dir: Path, *, enabled: bool = True, tensorboard: bool = True):
        self.enabled = enabled
        self.path = Path(out_dir) / "metrics.jsonl"
        self.writer = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if tensorboard:
                from tensorboardX import SummaryWriter

                self.writer = SummaryWriter(str(Path(out_dir) / "tb"))

    def log(self, step: int, metrics: dict[str, Any], stage: str = "") -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3), **({"stage": stage} if stage else {}), **metrics}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(f"{stage}/{key}" if stage else key, value, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(path: Path, out: Path, keys: tuple[str, ...] = PLOT_KEYS, stage: str | None = None) -> Path:
    """One panel per metric against the step; several runs' stages (sft, value, ppo) are drawn as separate lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(path)
    if stage is not None:
        records = [r for r in records if r.get("stage", "") == stage]
    present = [k for k in keys if any(k in r for r in records)]
    if not present:
        raise ValueError(f"none of {', '.join(keys)} is in {path}")
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present)), sharex=False, squeeze=False)
    for axis, key in zip(axes[:, 0], present, strict=True):
        stages = sorted({r.get("stage", "") for r in records if key in r})
        for name in stages:
            points = [(r["step"], r[key]) for r in records if key in r and r.get("stage", "") == name]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=name or key)
        axis.set_ylabel(key.replace("_", " "))
        axis.grid(alpha=0.3)
        if len(stages) > 1:
            axis.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
