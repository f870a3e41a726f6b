#!/usr/bin/env python3
"""Rejection sampling on browser suite tasks: a Chromium started per attempt (`keep_sessions: false`, the baseline)
against browser sessions kept by the run and reset between attempts (the default). Both sample the same training
instances with the same model and the same seeded requests, in alternating rounds of one run, and must score the
same attempts; the table gives attempts/s, the machine's CPU-seconds per attempt, sessions started and the ratios.

Needs the stack up (`scripts/run` or a `scripts/demo-flywheel` run's): the database, the sandbox service and a model
with an endpoint (the active one by default). Its tasks (`<instance>@bench-rft`) and rollouts are deleted at the end.

    .venv/bin/python bench/rft_sessions.py
    .venv/bin/python bench/rft_sessions.py --model demo-agent-s0-…-sft --families click-button,radio --per-family 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annotation_app.settings")

import django  # noqa: E402

django.setup()

from evaluation import FAMILIES, _key_file, machine_cpu_s, pace  # noqa: E402 - bench/evaluation.py, beside this file

from annotation_app.models import Task, Trajectory  # noqa: E402
from annotation_app.task_import import import_tasks  # noqa: E402
from flywheel.models import Iteration, ModelVersion  # noqa: E402
from flywheel.rft import rollouts_of, run_rft  # noqa: E402
from sandbox.suite import suite_tasks  # noqa: E402

SUFFIX = "@bench-rft"


def bench_tasks(families: list[str], per_family: int, level: int) -> list[Task]:
    rows = suite_tasks(families, train=per_family, heldout=0, levels=[level])
    rows = [{**row, "id": row["id"] + SUFFIX} for row in rows]
    import_tasks("".join(json.dumps(row) + "\n" for row in rows).encode(), "bench-rft.jsonl", on_conflict="skip")
    return list(Task.objects.filter(external_id__in=[row["id"] for row in rows]).order_by("pk"))


def run(model: ModelVersion, tasks: list[Task], keep: bool, args: argparse.Namespace) -> dict:
    config = {"tasks": [t.pk for t in tasks], "attempts": args.attempts, "max_steps": args.max_steps, "seed": 0,
              "temperature": args.temperature, "max_tokens": args.max_tokens, "concurrency": args.concurrency,
              "keep_sessions": keep}  # fmt: skip
    iteration = Iteration.objects.create(base_model=model, selected_stages=["rft"], config={"rft": config},
                                         stages={"rft": {"status": "running", "done": 0, "total": None}})  # fmt: skip
    cpu, started = machine_cpu_s(), time.perf_counter()
    try:
        output = run_rft(iteration, lambda done, total: None)
        wall, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
        outcomes = {(t.task_id, t.metadata["rft"]["attempt"]): t.outcome_reward for t in rollouts_of(iteration)}
    finally:
        forget(iteration)
    if output["error_count"]:
        raise SystemExit(f"attempts failed: {output['errors'][:3]}")
    sessions = output["browser_sessions"]["leased"] if keep else output["attempts"]
    return {"wall": wall, "cpu": cpu, "attempts": output["attempts"], "successes": output["successes"],
            "sessions": sessions, "outcomes": sorted(outcomes.items())}  # fmt: skip


def forget(iteration: Iteration) -> None:
    """The bench's rollouts (and their screenshots) and iteration: nothing of it reaches a training store."""
    for trajectory in rollouts_of(iteration):
        for step in trajectory.steps.all():
            if step.screenshot:
                step.screenshot.delete(save=False)
    rollouts_of(iteration).delete()
    iteration.delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="registry name (default: the active model)")
    parser.add_argument("--families", default=FAMILIES)
    parser.add_argument("--per-family", type=int, default=2, help="training instances of each family")
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=2, help="attempts at once (the demonstration's)")
    args = parser.parse_args()
    os.environ.setdefault("SANDBOX_API_KEY", _key_file())
    models = ModelVersion.objects.exclude(endpoint_url="")
    model = models.filter(name=args.model).first() if args.model else models.filter(is_active=True).first()
    if model is None:
        raise SystemExit(f"no model {args.model or '(active)'} with an endpoint in the registry")
    tasks = bench_tasks(args.families.split(","), args.per_family, args.level)
    results: dict[bool, list[dict]] = {False: [], True: []}
    try:
        for _ in range(args.rounds):
            for keep in (False, True):
                results[keep].append(run(model, tasks, keep, args))
    finally:
        Trajectory.objects.filter(task__in=tasks).delete()
        Task.objects.filter(pk__in=[t.pk for t in tasks]).delete()
    same = "yes" if len({json.dumps(r["outcomes"]) for rs in results.values() for r in rs}) == 1 else "NO"
    print(f"{model.name}: {len(tasks)} level-{args.level} training tasks ({args.families}) × {args.attempts} "
          f"attempts, temperature {args.temperature}, seeded, concurrency {args.concurrency}, {args.rounds} rounds "
          f"each; same outcome for every attempt in every run: {same}\n")  # fmt: skip
    print("| browser sessions | attempts/s | CPU-s per attempt | sessions started | successes | × attempts/s | × CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = results[False]
    base_rate, base_cpu = pace(base, "attempts")
    for keep, name in ((False, "one per attempt (baseline)"), (True, "kept and reset (keep_sessions)")):
        rs = results[keep]
        rate, cpu = pace(rs, "attempts")
        started = "/".join(str(r["sessions"]) for r in rs)
        wins = "/".join(str(r["successes"]) for r in rs)
        print(f"| {name} | {rate:.2f} | {cpu:.2f} | {started} | {wins} | {rate / base_rate:.2f} | "
              f"{cpu / base_cpu:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
