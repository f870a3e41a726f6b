#!/usr/bin/env python3
"""Held-out evaluation on the sandbox: a fresh browser session per episode (the baseline) against one session kept
and reset between episodes (`sandbox:reuse=1`, the default). Both play the same suite tasks with the same greedy
model in the same run, alternating, and must score the same episodes; the table gives episodes/s, the machine's
CPU-seconds per episode (Chromium's start is most of the difference) and the ratios.

Needs the sandbox service (`scripts/run`, or `python -m sandbox.service` with Redis up) and a checkpoint:

    .venv/bin/python bench/evaluation.py --model var/flywheel-runs/iteration-1/sft/trainer/final
    .venv/bin/python bench/evaluation.py --model M --families click-button,radio --per-family 4 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox.suite import suite_tasks
from training.evaluate import evaluate_checkpoint

FAMILIES = "click-button,type-field,radio,checkboxes,dropdown,search"


def machine_cpu_s() -> float:
    """CPU-seconds the whole machine has spent (every process: the service's Chromiums are not ours)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run(model: str, tasks: Path, episodes: int, reuse: bool, args: argparse.Namespace) -> dict[str, float]:
    cpu, started = machine_cpu_s(), time.perf_counter()
    report = evaluate_checkpoint(
        model, f"sandbox:max_steps={args.max_steps},reuse={int(reuse)}", episodes=episodes, seed=0,
        max_new_tokens=args.max_new_tokens, max_turns=args.max_steps, tasks=str(tasks), concurrency=args.concurrency,
        sandbox_api_key=os.environ.get("SANDBOX_API_KEY") or _key_file(),
    )  # fmt: skip
    wall, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
    if report["errors"]:
        raise SystemExit(f"episodes failed to play: {report['errors'][:3]}")
    wins = sorted(t for t, c in report["by_task"].items() if c["successes"])
    return {"wall": wall, "cpu": cpu, "episodes": report["episodes"], "successes": report["successes"], "wins": wins}


def pace(runs: list[dict], unit: str) -> tuple[float, float]:
    """Over `runs` (each with `wall`, `cpu` and a count under `unit`): units per second, and CPU-seconds per unit."""
    units = sum(r[unit] for r in runs)
    return units / sum(r["wall"] for r in runs), sum(r["cpu"] for r in runs) / units


def _key_file() -> str:
    path = Path(__file__).resolve().parent.parent / "var" / "sandbox-api-key"
    return path.read_text().strip() if path.is_file() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a checkpoint directory (the suite agent, trained or not)")
    parser.add_argument("--families", default=FAMILIES)
    parser.add_argument("--per-family", type=int, default=4, help="held-out instances of each family")
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at once (the CLI's default)")
    args = parser.parse_args()
    tasks = list(suite_tasks(args.families.split(","), train=0, heldout=args.per_family, levels=[args.level]))
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        task_file = Path(tmp) / "heldout.jsonl"
        task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
        results: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.rounds):
            for reuse in (False, True):
                results[reuse].append(run(args.model, task_file, len(tasks), reuse, args))
    base = results[False]
    outcomes = {json.dumps(r["wins"]) for rs in results.values() for r in rs}
    same = "yes" if len(outcomes) == 1 else "NO"
    print(f"{len(tasks)} level-{args.level} tasks ({args.families}), {args.rounds} rounds each, "
          f"concurrency {args.concurrency}; same episodes won in every run: {same}\n")  # fmt: skip
    print("| sessions | episodes/s | CPU-s per episode | successes | × episodes/s | × CPU-s |")
    print("|---|---:|---:|---:|---:|---:|")
    base_rate, base_cpu = pace(base, "episodes")
    for reuse, name in ((False, "fresh per episode (baseline)"), (True, "kept and reset (reuse=1)")):
        rs = results[reuse]
        rate, cpu = pace(rs, "episodes")
        wins = "/".join(str(r["successes"]) for r in rs)
        print(f"| {name} | {rate:.2f} | {cpu:.2f} | {wins} | {rate / base_rate:.2f} | {cpu / base_cpu:.2f} |")


if __name__ == "__main__":
    main()
