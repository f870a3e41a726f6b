#!/usr/bin/env python3
"""Streaming rollout pool vs synchronous batches (issue 5), PPO end to end on the tiny model.

Both runs train the same tiny policy with the same PPO settings on the copy task with long-tailed episode lengths
(turns ~ 3·LogNormal(0, 1), capped at 24) and 20 ms of environment time per step (about one sandbox action plus a
screenshot, see bench/live.py). The synchronous baseline plays a batch turn by turn and waits for its longest
episode, and rollouts stop while the trainer updates; the streaming pool keeps episodes running and updates on the
first finished ones (max staleness 1). Figure: finished trajectories per second over the whole run (goal ≥ 1.5×),
and turns per second beside it, because a pool that trains on the first finished episodes favours short ones.
Usage: .venv/bin/python bench/rollout_pool.py [--iterations 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from training.metrics import read_metrics
from training.policy.tiny import build_tiny_text_checkpoint
from training.ppo import PPOConfig, PPOTrainer

ENV = "copy:turns=3,tail=1.0,max_turns=24,latency_s=0.02"


def run(model: Path, out: Path, *, streaming: bool, iterations: int, batch: int) -> dict[str, float]:
    cfg = PPOConfig(model=str(model), out=str(out), env=ENV, episodes_per_step=batch, concurrency=batch,
                    max_staleness=1, streaming=streaming, iterations=iterations, max_new_tokens=4, max_turns=24,
                    actor_lr=1e-4, critic_lr=1e-3, progress=False)  # fmt: skip
    started = time.perf_counter()
    PPOTrainer(cfg).run()
    elapsed = time.perf_counter() - started
    metrics = read_metrics(out)
    return {
        "seconds": elapsed,
        "trajectories_per_s": iterations * batch / elapsed,
        "turns": statistics.mean(m["turns"] for m in metrics),
        "update_s": statistics.mean(m["step_s"] - m["rollout_s"] for m in metrics),
        "staleness": statistics.mean(m["staleness"] for m in metrics),
        "dropped": metrics[-1].get("dropped_stale", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_text_checkpoint(Path(tmp) / "model")
        sync = run(model, Path(tmp) / "sync", streaming=False, iterations=args.iterations, batch=args.batch)
        stream = run(model, Path(tmp) / "stream", streaming=True, iterations=args.iterations, batch=args.batch)
    print(f"PPO, {args.iterations} updates x {args.batch} episodes, env {ENV}\n")
    print("| rollouts | seconds | trajectories/s | vs sync | goal | mean turns | turns/s | vs sync | "
          "update s/it | mean staleness | dropped stale |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r, goal in (("synchronous batches (baseline)", sync, ""), ("streaming pool", stream, ">= 1.5x")):
        ratio = r["trajectories_per_s"] / sync["trajectories_per_s"]
        turns = r["trajectories_per_s"] * r["turns"]
        turns_ratio = turns / (sync["trajectories_per_s"] * sync["turns"])
        print(f"| {name} | {r['seconds']:.1f} | {r['trajectories_per_s']:.1f} | {ratio:.2f}x | {goal} | "
              f"{r['turns']:.2f} | {turns:.1f} | {turns_ratio:.2f}x | {r['update_s']:.2f} | {r['staleness']:.2f} | "
              f"{r['dropped']} |")  # fmt: skip


if __name__ == "__main__":
    main()
