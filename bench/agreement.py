"""Agreement computation over 10k overlapping tasks (annotation_app.agreement), against a per-task baseline.

Seeds a dedicated database (`annotation_agreement_bench`, created, migrated, filled with COPY, dropped at the end
unless --keep): `--tasks` tasks, each done by k = 2 annotators (every tenth by 3) out of 40, trajectories of 3-12
steps whose actions mostly agree, a verifier outcome on half the tasks, two reviewers' rubric scores on a fifth of
the trajectories. Then measures, in one run:
- bulk: `all_task_agreements()` (four bulk queries, then the pure functions) and the pair table from its result,
  as the agreement page computes them; wall-clock and CPU seconds of this process;
- baseline: `task_agreement(task_id)` called task by task (its queries per task), on a sample, extrapolated;
- the similarity alone: rapidfuzz's Levenshtein against a pure-Python dynamic programme over the same tokens.

    .venv/bin/python bench/agreement.py                  # 10k tasks
    .venv/bin/python bench/agreement.py --tasks 1000 --baseline 200
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import flywheel_validation as fv  # noqa: E402  (the bench database helpers: env, create/drop, COPY)

fv.BENCH_DB = "annotation_agreement_bench"
ACTIONS = [
    "click(start_box='({x},{y})')",
    "left_double(start_box='({x},{y})')",
    "type(content='hello {x}')",
    "hotkey(key='ctrl s')",
    "scroll(start_box='({x},{y})', direction='down')",
    "wait()",
]


def plan(rng: random.Random) -> list[str]:
    """A reference solution: 3-12 actions."""
    return [
        rng.choice(ACTIONS).format(x=rng.randrange(10, 1900), y=rng.randrange(10, 1070))
        for _ in range(rng.randint(3, 12))
    ]


def variant(reference: list[str], rng: random.Random) -> list[str]:
    """An annotator's take on the reference: mostly the same, sometimes a changed, dropped or extra step."""
    out = []
    for action in reference:
        roll = rng.random()
        if roll < 0.08:
            continue
        out.append(plan(rng)[0] if roll < 0.2 else action)
        if rng.random() < 0.05:
            out.append("wait()")
    return out or reference[:1]


def seed(n_tasks: int, rng: random.Random) -> None:
    """Tasks done by 2 (every tenth by 3) of 40 annotators, their steps, and reviewers' rubric scores."""
    from annotation_app.models import Review, Role, Step, Task, Trajectory, User
    from annotation_app.trajectories import typed_action

    annotators = [User.objects.create(username=f"agreement-bench-{i}") for i in range(40)]
    reviewers = [User.objects.create(username=f"agreement-bench-lead-{i}", role=Role.DATA_LEAD) for i in range(2)]
    fv.copy_rows(
        Task,
        (
            {"instruction": f"Bench task {i}", "required_annotations": 3 if i % 10 == 0 else 2, "status": "completed"}
            for i in range(n_tasks)
        ),
    )
    tasks = list(Task.objects.order_by("id").values_list("id", "required_annotations"))
    now = datetime.now(UTC)
    solutions: dict[int, list[str]] = {}
    rows = []
    for task_id, k in tasks:
        reference = plan(rng)
        verified = rng.random() < 0.5
        for annotator in rng.sample(annotators, k):
            actions = variant(reference, rng)
            outcome = (1.0 if rng.random() < 0.8 else 0.0) if verified else None
            rows.append((task_id, annotator.pk, outcome, actions))
    fv.copy_rows(
        Trajectory,
        (
            {
                "task_id": task_id,
                "annotator_id": annotator_id,
                "mode": "interactive",
                "status": "submitted",
                "outcome_reward": outcome,
                "screen_width": 1920,
                "screen_height": 1080,
                "submitted_at": now,
            }
            for task_id, annotator_id, outcome, _ in rows
        ),
    )
    ids = list(Trajectory.objects.order_by("id").values_list("id", flat=True))
    parsed: dict[str, dict[str, Any]] = {}

    def step_rows() -> Iterator[dict[str, Any]]:
        for pk, (_, _, _, actions) in zip(ids, rows, strict=True):
            solutions[pk] = actions
            for index, text in enumerate(actions):
                action = parsed.setdefault(text, typed_action(text))
                yield {"trajectory_id": pk, "index": index, "action_text": text, "action": action}

    steps = fv.copy_rows(Step, step_rows())
    reviewed = [pk for pk in ids if rng.random() < 0.2]

    def review_rows() -> Iterator[dict[str, Any]]:
        for pk in reviewed:
            base = rng.randint(1, 5)
            for reviewer in reviewers:
                scores = {c: min(5, max(1, base + rng.choice([-1, 0, 0, 1]))) for c in ("done", "efficient")}
                yield {"trajectory_id": pk, "reviewer_id": reviewer.pk, "verdict": "approve", "scores": scores}

    reviews = fv.copy_rows(Review, review_rows())
    fv.log(f"  {len(tasks)} tasks, {len(ids)} trajectories, {steps} steps, {reviews} reviews")


def python_levenshtein(a: Sequence[Any], b: Sequence[Any]) -> float:
    """The baseline similarity: the textbook dynamic programme, normalised like rapidfuzz's."""
    if not a and not b:
        return 1.0
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return 1.0 - previous[-1] / max(len(a), len(b))


def timed(fn: Any) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process and its PostgreSQL backend): on a loaded machine the CPU
    seconds show the cost, the wall seconds the wait."""
    wall, cpu = time.perf_counter(), time.process_time() + fv.backend_cpu_s()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() + fv.backend_cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=500, help="tasks the per-task loop computes")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    parser.add_argument("--reuse", action="store_true", help="measure on the database a --keep run left")
    args = parser.parse_args()
    env = fv.project_env()
    if not args.reuse:
        fv.create_database(env)
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    from annotation_app import agreement

    try:
        rng = random.Random(0)
        if not args.reuse:
            fv.log(f"seeding {args.tasks} overlapping tasks (COPY)")
            seed(args.tasks, rng)
        fv.log("bulk: all_task_agreements + pair table")
        with CaptureQueriesContext(connection) as queries:
            results, wall, cpu = timed(agreement.all_task_agreements)
            pairs, pair_wall, pair_cpu = timed(lambda: agreement.pair_agreement(results))
        bulk_queries = len(queries)
        reset_queries()
        sample = rng.sample(sorted(results), min(args.baseline, len(results)))
        fv.log(f"baseline: task_agreement task by task on {len(sample)} tasks")
        with CaptureQueriesContext(connection) as queries:
            checked, base_wall, base_cpu = timed(lambda: [agreement.task_agreement(pk) for pk in sample])
        assert all(c == results[pk] for c, pk in zip(checked, sample, strict=True)), "the two ways disagree"
        per_task_queries = len(queries) / len(sample)
        tokens = [
            [agreement.step_tokens(a.steps, a.width, a.height) for a in found]
            for found in agreement.load_annotations(sample).values()
        ]
        pairs_of_tokens = [(t[0], t[1]) for t in tokens]
        _, rf_wall, _ = timed(lambda: [agreement.similarity(a, b) for a, b in pairs_of_tokens * 20])
        _, py_wall, _ = timed(lambda: [python_levenshtein(a, b) for a, b in pairs_of_tokens * 20])
        _, first_wall, first_cpu = timed(agreement.cached_task_agreements)
        _, cached_wall, cached_cpu = timed(agreement.cached_task_agreements)
        n = len(results)
        base_total = base_wall / len(sample) * n
        base_cpu_total = base_cpu / len(sample) * n
        low = sum(1 for r in results.values() if r["agreement"] is not None and r["agreement"] < 0.5)
        annotation_pairs = sum(len(r["pairs"]) for r in results.values())
        print()
        print(f"{n:,} overlapping tasks, {annotation_pairs:,} annotation pairs, {len(pairs):,} annotator pairs, "
              f"{low:,} below 0.5; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        print()
        print("| measure | wall s | CPU s (process + PostgreSQL) | queries | tasks/s | ratio vs baseline (wall) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        rows = [
            ("bulk all_task_agreements", wall, cpu, str(bulk_queries)),
            ("pair table from its result", pair_wall, pair_cpu, "0"),
            ("cached_task_agreements, first call", first_wall, first_cpu, ""),
            ("cached_task_agreements, later calls (the page)", cached_wall, cached_cpu, ""),
            (f"baseline: task_agreement per task (from {len(sample)})", base_total, base_cpu_total,
             f"{per_task_queries:.0f} per task"),
        ]  # fmt: skip
        for name, w, c, q in rows:
            cpu_text = f"{c:.2f}" if c is not None else ""
            rate = f"{n / w:,.0f}" if "pair table" not in name else ""
            print(f"| {name} | {w:.3f} | {cpu_text} | {q} | {rate} | {base_total / w:,.1f}x |")
        m = len(pairs_of_tokens) * 20
        print()
        print("| similarity of one pair | µs | ratio |")
        print("| --- | ---: | ---: |")
        print(f"| rapidfuzz Levenshtein | {rf_wall / m * 1e6:.1f} | {py_wall / rf_wall:.1f}x faster |")
        print(f"| pure-Python dynamic programme | {py_wall / m * 1e6:.1f} | 1.0x |")
    finally:
        if not args.keep:
            fv.drop_database(env)


if __name__ == "__main__":
    main()
