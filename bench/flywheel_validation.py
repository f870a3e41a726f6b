"""Flywheel validation + routing throughput: 100k trajectories x 10 steps in PostgreSQL (ORM excluded).

Seeds a dedicated database (`annotation_flywheel_bench`, created, migrated, filled with COPY, dropped at the end
unless --keep) and measures, in one run:
- the stage as the Celery task runs it (`flywheel.iterations.validate_and_route`: chunks of 2,000, one query for the
  trajectories, one for their steps, a COPY and one INSERT, one progress update per chunk; the next chunk fetched on
  a second connection meanwhile), wall-clock; then its queries and CPU seconds (this process + its PostgreSQL
  backend) in a second, inline pass, so the cost shows apart from the machine's load;
- the baseline: the naive per-trajectory ORM loop (get the trajectory, its steps, its review and capture, parse each
  action with the full parser, save one Validation), on a sample, extrapolated per trajectory;
- the queries per chunk for trajectories of 2 steps and of `--steps` steps (they must be equal).

    .venv/bin/python bench/flywheel_validation.py                 # 100k x 10
    .venv/bin/python bench/flywheel_validation.py --trajectories 20000 --baseline 500

Goal: >= 5,000 trajectories/s, queries flat in steps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_db import create_database, drop_database, log

ROOT = Path(__file__).resolve().parents[1]
BENCH_DB = "annotation_flywheel_bench"
ACTIONS = [
    "click(start_box='<|box_start|>({x},{y})<|box_end|>')",
    "left_double(start_box='<|box_start|>({x},{y})<|box_end|>')",
    "type(content='hello world {x}\\n')",
    "hotkey(key='ctrl s')",
    "scroll(start_box='<|box_start|>({x},{y})<|box_end|>', direction='down')",
    "drag(start_box='<|box_start|>({x},{y})<|box_end|>', end_box='<|box_start|>({y},{x})<|box_end|>')",
]


def project_env() -> dict[str, str]:
    """scripts/env.sh's environment pointed at the bench database."""
    out = subprocess.run(
        ["bash", "-c", "source scripts/env.sh >/dev/null && env -0"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    env.update(DATABASE_NAME=BENCH_DB, DJANGO_SETTINGS_MODULE="annotation_app.settings", DJANGO_DEBUG="0")
    return env


def _row(model: Any, values: dict[str, Any], now: datetime) -> list[Any]:
    """A COPY row for `model`: given values, else the field's default (JSON encoded), timestamps now."""
    row = []
    for f in _columns(model):
        if f.attname in values:
            value = values[f.attname]
        elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            value = now
        else:
            value = f.get_default()
        if f.get_internal_type() == "JSONField" and value is not None:
            value = json.dumps(value)
        row.append(value)
    return row


def _columns(model: Any) -> list[Any]:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


def copy_rows(model: Any, rows: Iterator[dict[str, Any]]) -> int:
    """COPY dict rows into `model`'s table (psycopg 3's COPY, through Django's connection)."""
    from django.db import connection

    now = datetime.now(UTC)
    columns = ", ".join(f'"{f.column}"' for f in _columns(model))
    count = 0
    with connection.cursor() as cursor, cursor.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy:
        for values in rows:
            copy.write_row(_row(model, values, now))
            count += 1
    return count


def seed(n: int, steps: int, domain: str, rng: random.Random) -> None:
    """`n` submitted trajectories of `steps` steps in task domain `domain`, 30% reviewed, in-situ ones with a
    capture, 3% broken (a missing screenshot or an unparseable action)."""
    from django.db import connection

    from annotation_app.models import Capture, Review, Role, Step, Task, Trajectory, User

    lead, _ = User.objects.get_or_create(username="flywheel-bench-lead", defaults={"role": Role.DATA_LEAD})
    annotator, _ = User.objects.get_or_create(username="flywheel-bench-annotator")
    tasks = Task.objects.bulk_create(
        [Task(instruction=f"Bench task {i} in {domain}", domain=domain) for i in range(50)]
    )
    modes = ["interactive", "in_situ", "rollout"]
    now = datetime.now(UTC)
    start_id = Trajectory.objects.order_by("-id").values_list("id", flat=True).first() or 0
    copy_rows(
        Trajectory,
        (
            {
                "task_id": rng.choice(tasks).pk,
                "annotator_id": annotator.pk,
                "mode": rng.choice(modes),
                "status": "submitted",
                "outcome_reward": rng.choice([None, 0.0, 1.0]),
                "screen_width": 1920,
                "screen_height": 1080,
                "submitted_at": now,
            }
            for _ in range(n)
        ),
    )
    rows = list(Trajectory.objects.filter(id__gt=start_id).order_by("id").values_list("id", "mode"))
    log(f"  {len(rows)} trajectories; steps…")

    def step_rows() -> Iterator[dict[str, Any]]:
        for pk, _ in rows:
            broken = rng.random() < 0.03
            bad = rng.randrange(steps) if broken else -1
            for i in range(steps):
                text = rng.choice(ACTIONS).format(x=rng.randrange(1920), y=rng.randrange(1080))
                shot = f"trajectories/{pk}/steps/{i:05d}.jpg"
                if i == bad:
                    if rng.random() < 0.5:
                        text = "clik(start_box='(1,2)')"
                    else:
                        shot = ""
                yield {
                    "trajectory_id": pk,
                    "index": i,
                    "screenshot": shot,
                    "thought": "I click the button." if rng.random() < 0.9 else "",
                    "action_text": text,
                    "status": "done",
                }

    copy_rows(Step, step_rows())
    reviewed = [pk for pk, _ in rows if rng.random() < 0.3]
    copy_rows(
        Review,
        (
            {
                "trajectory_id": pk,
                "reviewer_id": lead.pk,
                "verdict": rng.choice(["approve", "approve", "reject"]),
                "score": rng.choice([None, 3, 4, 5]),
                "comment": "",
            }
            for pk in reviewed
        ),
    )
    copy_rows(
        Capture,
        (
            {
                "annotator_id": annotator.pk,
                "session_id": uuid.uuid4(),
                "size": 1,
                "sha256": "0" * 64,
                "trajectory_id": pk,
                "status": "submitted",
                "flags": rng.choice([[], [], ["no_speech"], ["near_duplicate:1"]]),
            }
            for pk, mode in rows
            if mode == "in_situ"
        ),
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def backend_cpu_s() -> float:
    """CPU seconds PostgreSQL's backend process for this connection has used (same host: /proc)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def cpu_time() -> Iterator[list[float]]:
    """CPU seconds spent inside the block by this process and by its database backend: the cost, whatever the load."""
    used = [0.0]
    client, server = time.process_time(), backend_cpu_s()
    yield used
    used[0] = time.process_time() - client + backend_cpu_s() - server


@contextmanager
def counting() -> Iterator[list[int]]:
    """Count the queries run inside the block (a wrapper, not Django's debug cursor, so it costs nothing)."""
    from django.db import connection

    count = [0]

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        count[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield count


def iteration_for(domain: str) -> Any:
    from django.utils import timezone

    from flywheel.iterations import start_iteration
    from flywheel.models import Iteration

    iteration = start_iteration(None, scope=Iteration.Scope.ALL, domains=[domain], stages=["validate"], enqueue=False)
    iteration.scope_until = timezone.now()
    iteration.status = Iteration.Status.RUNNING
    iteration.save()
    return iteration


def run_stage(domain: str, chunk: int) -> tuple[int, float, float, int, dict[str, Any]]:
    """The stage as the worker runs it (the next chunk prefetched on a second connection), timed; then again, on a
    fresh iteration, inline on one connection, where its queries and its CPU (client + backend) are counted."""
    import flywheel.iterations as stage
    from flywheel.models import Validation

    iteration = iteration_for(domain)
    started = time.perf_counter()
    output = stage.validate_and_route(iteration, chunk=chunk)
    seconds = time.perf_counter() - started
    stage.PREFETCH = False
    try:
        with counting() as queries, cpu_time() as cpu:
            stage.validate_and_route(iteration_for(domain), chunk=chunk)
    finally:
        stage.PREFETCH = True
    return Validation.objects.filter(iteration=iteration).count(), seconds, cpu[0], queries[0], output


def run_baseline(domain: str, sample: int) -> tuple[int, float, float, int]:
    """The naive loop: per trajectory, the ORM fetches it, its steps, review and capture; each action goes through
    the full parser; one INSERT per Validation."""
    from annotation_app.models import Capture, Trajectory
    from flywheel.models import Validation
    from flywheel.validation import Review, Signals, VConfig, validate
    from sandbox.actions import ActionSyntaxError, parse_actions

    iteration = iteration_for(domain)
    config = VConfig.from_dict(iteration.config["v"])
    ids = list(Trajectory.objects.filter(task__domain=domain).order_by("id").values_list("id", flat=True)[:sample])
    with counting() as queries, cpu_time() as cpu:
        started = time.perf_counter()
        for pk in ids:
            trajectory = Trajectory.objects.get(pk=pk)
            steps = list(trajectory.steps.order_by("index"))
            review = trajectory.reviews.order_by("-created_at", "-id").first()
            capture = Capture.objects.filter(trajectory=trajectory).first()
            parsed_ok = []
            for step in steps:
                try:
                    parse_actions(step.action_text)
                    parsed_ok.append(step.action_text)
                except ActionSyntaxError:
                    parsed_ok.append("clik(")  # keeps the failure for validate() to report
            verdict = validate(
                Signals(
                    trajectory_id=pk,
                    mode=trajectory.mode,
                    indices=[s.index for s in steps],
                    actions=parsed_ok,
                    no_screenshot=[s.index for s in steps if not s.screenshot],
                    unfinished=[s.index for s in steps if s.status != "done"],
                    with_thought=sum(1 for s in steps if s.thought),
                    outcome_reward=trajectory.outcome_reward,
                    review=Review(review.pk, review.verdict, review.score) if review else None,
                    capture_flags=capture.flags if capture else None,
                ),
                config,
            )
            Validation.objects.create(
                iteration=iteration,
                trajectory=trajectory,
                v=verdict.v,
                components=verdict.components,
                route=verdict.route,
                reason=verdict.reason,
                threshold=verdict.threshold,
            )
        seconds = time.perf_counter() - started
    return len(ids), seconds, cpu[0], queries[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--baseline", type=int, default=2000, help="trajectories the naive loop validates")
    parser.add_argument("--chunk", type=int, default=2000)
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    env = project_env()
    create_database(env, BENCH_DB)
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    try:
        rng = random.Random(0)
        log(f"seeding {args.trajectories} x {args.steps} steps (COPY)")
        started = time.perf_counter()
        seed(args.trajectories, args.steps, "main", rng)
        few = max(args.trajectories // 10, 100)
        seed(few, 2, "few", rng)  # 2 steps each, validated in as many chunks: the queries must be the same
        log(f"seeded in {time.perf_counter() - started:.1f} s")
        log("validation + routing stage…")
        n, seconds, cpu, queries, output = run_stage("main", args.chunk)
        log("the same stage on 2-step trajectories, in as many chunks…")
        chunks = -(-n // args.chunk)
        few_chunk = -(-few // chunks)
        few_n, few_seconds, few_cpu, few_queries, _ = run_stage("few", few_chunk)
        log(f"baseline: naive per-trajectory ORM loop on {args.baseline}…")
        base_n, base_seconds, base_cpu, base_queries = run_baseline("main", args.baseline)
    finally:
        if not args.keep:
            drop_database(env, BENCH_DB)
    rate, base_rate = n / seconds, base_n / base_seconds
    few_chunks = -(-few_n // few_chunk)
    print()
    print(f"Flywheel validation + routing, {args.trajectories:,} trajectories x {args.steps} steps (ORM excluded)")
    print()
    print("| variant | trajectories | steps each | wall s | trajectories/s | CPU s (client + PostgreSQL) "
          "| trajectories per CPU-s | queries | queries per chunk | vs baseline (wall) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = [
        ("naive per-trajectory ORM loop (baseline)", base_n, args.steps, base_seconds, base_cpu, base_queries,
         f"{base_queries / base_n:.1f} per trajectory"),
        (f"bulk stage (chunks of {args.chunk:,})", n, args.steps, seconds, cpu, queries, f"{queries / chunks:.1f}"),
        (f"bulk stage, 2-step trajectories (chunks of {few_chunk:,})", few_n, 2, few_seconds, few_cpu, few_queries,
         f"{few_queries / few_chunks:.1f}"),
    ]  # fmt: skip
    for name, count, steps, wall, used, q, per_chunk in table:
        print(
            f"| {name} | {count:,} | {steps} | {wall:.2f} | {count / wall:,.0f} | {used:.2f} | {count / used:,.0f} "
            f"| {q:,} | {per_chunk} | {count / wall / base_rate:.1f}x |"
        )
    load = os.getloadavg()
    print(f"\nload average during the run: {load[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    print()
    print(f"routes: {output['routes']}  SFT share: {output['sft_share']}")
    print(f"goal >= 5,000 trajectories/s: {'met' if rate >= 5000 else 'NOT met'} ({rate:,.0f}/s); ", end="")
    flat = chunks == few_chunks and queries == few_queries
    print(f"queries flat in steps: {'yes' if flat else 'NO'} ({queries} vs {few_queries} in {chunks} chunks)")


if __name__ == "__main__":
    main()
