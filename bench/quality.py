"""Quality dashboard speed at 100k tasks, 10k trajectories (10 steps each) and 100 annotators (issue 17).

Seeds a dedicated database (`annotation_quality_bench`: created, migrated, filled with COPY, dropped at the end
unless --keep) and measures, in one run:
- the refresh (annotation_app.quality.aggregates.refresh, what the beat task runs): wall time, --refreshes times;
- the dashboard page over HTTP through gunicorn as the Procfile runs it (2 gthread workers), logged in as a data
  lead: p50/p95 of --requests sequential GETs after a warm-up;
- the same page in-process (Django's test client: view + template, no HTTP), for a like-for-like comparison with
  the baseline; and with the rendered figures not cached (the first load after each refresh);
- the baseline: the same figures counted live on every load with the ORM (per annotator: trajectories, steps,
  reviews, gold rewards; per model: every proposed step read and classified in Python; coverage group-bys), which is
  what a dashboard without precomputed aggregates would do.

    .venv/bin/python bench/quality.py                      # 100k tasks, 10k trajectories, 100 annotators
    .venv/bin/python bench/quality.py --tasks 10000 --trajectories 1000 --requests 50

Goal: page p95 <= 300 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_db import admin_connection, create_database, drop_database, log

ROOT = Path(__file__).resolve().parents[1]
BENCH_DB = "annotation_quality_bench"
DOMAINS = ["chrome", "libreoffice_calc", "libreoffice_writer", "gimp", "vlc", "thunderbird", "vscode", "os",
           "files", "terminal", "settings", "mail"]  # fmt: skip
ACTIONS = [
    ("click", "click(start_box='({x},{y})')"),
    ("type", "type(content='hello {x}')"),
    ("scroll", "scroll(start_box='({x},{y})', direction='down')"),
    ("hotkey", "hotkey(key='ctrl s')"),
]


def project_env() -> dict[str, str]:
    """scripts/env.sh's environment pointed at the bench database."""
    out = subprocess.run(
        ["bash", "-c", "source scripts/env.sh >/dev/null && env -0"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    env = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    keep = {k: os.environ[k] for k in ("REDIS_DB_CELERY", "REDIS_DB_CHANNELS", "REDIS_DB_CACHE") if k in os.environ}
    env.update(keep, DATABASE_NAME=BENCH_DB, DJANGO_SETTINGS_MODULE="annotation_app.settings_test", DJANGO_DEBUG="0")
    return env


def copy_rows(model: Any, rows: Iterator[dict[str, Any]]) -> int:
    """COPY dict rows into `model`'s table: given values, else each field's default; timestamps now."""
    from django.db import connection

    now = datetime.now(UTC)
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    count = 0
    with connection.cursor() as cursor, cursor.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy:
        for values in rows:
            row = []
            for f in fields:
                if f.attname in values:
                    value = values[f.attname]
                elif getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
                    value = now
                else:
                    value = f.get_default()
                if f.get_internal_type() == "JSONField" and value is not None:
                    value = json.dumps(value)
                row.append(value)
            copy.write_row(row)
            count += 1
    return count


def seed(tasks: int, trajectories: int, annotators: int, steps: int, rng: random.Random) -> None:
    """Tasks over 12 domains, 4 platforms and 5 difficulties (2 % gold); trajectories over 60 days, 40 % reviewed;
    interactive steps with 3 candidates from one of 5 model versions, accepted, edited or overridden."""
    from django.contrib.auth.hashers import make_password

    from annotation_app.models import Review, Role, Step, Task, Trajectory, User
    from flywheel.models import ModelVersion

    password = make_password("bench")
    lead = User.objects.create(username="quality-bench-lead", role=Role.DATA_LEAD, password=password)
    people = User.objects.bulk_create([User(username=f"ann-{i:03d}", password=password) for i in range(annotators)])
    models = [ModelVersion.objects.create(name=f"bench-policy-{i}", checkpoint_uri=f"/m/{i}") for i in range(5)]
    platforms = ["desktop", "browser", "mobile", "game"]
    statuses = ["pending"] * 12 + ["assigned"] * 2 + ["completed"] * 5 + ["archived"]
    copy_rows(
        Task,
        (
            {
                "instruction": f"Bench task {i}",
                "platform": rng.choice(platforms),
                "domain": rng.choice(DOMAINS),
                "difficulty": rng.randint(1, 5),
                "is_gold": rng.random() < 0.02,
                "status": rng.choice(statuses),
            }
            for i in range(tasks)
        ),
    )
    task_rows = list(Task.objects.values_list("id", "is_gold"))
    log(f"  {len(task_rows)} tasks; trajectories…")
    now = datetime.now(UTC)
    t_statuses = ["submitted"] * 3 + ["approved"] * 4 + ["rejected"] + ["in_progress", "abandoned"]
    copy_rows(
        Trajectory,
        (
            {
                "task_id": (task := rng.choice(task_rows))[0],
                "annotator_id": rng.choice(people).pk,
                "mode": rng.choice(["interactive", "interactive", "in_situ"]),
                "status": (status := rng.choice(t_statuses)),
                "outcome_reward": rng.choice([0.0, 1.0]) if task[1] or rng.random() < 0.3 else None,
                "submitted_at": now - timedelta(minutes=rng.randrange(60 * 24 * 60))
                if status not in ("in_progress", "abandoned")
                else None,
                "model_version_id": rng.choice(models).pk,
            }
            for _ in range(trajectories)
        ),
    )
    traj_rows = list(Trajectory.objects.values_list("id", "mode", "model_version_id", "submitted_at", "status"))
    log(f"  {len(traj_rows)} trajectories; steps…")

    def step_rows() -> Iterator[dict[str, Any]]:
        for pk, mode, model_id, submitted, _ in traj_rows:
            end = submitted or now
            for i in range(steps):
                made = end - timedelta(seconds=20 * (steps - i))
                row: dict[str, Any] = {"trajectory_id": pk, "index": i, "status": "done", "thought": "Do it."}
                texts = [rng.choice(ACTIONS) for _ in range(3)]
                candidates = [
                    {"thought": "", "action_text": t.format(x=rng.randrange(1920), y=rng.randrange(1080)),
                     "actions": [{"type": kind}]}
                    for kind, t in texts
                ]  # fmt: skip
                if mode == "interactive":
                    chosen = rng.choice([0, 0, 0, 1, None])
                    text = candidates[chosen]["action_text"] if chosen is not None else "wait()"
                    if chosen is not None and rng.random() < 0.1:
                        text = "click(start_box='(1,1)')"  # edited after it was accepted
                    row.update(candidates=candidates, chosen_candidate=chosen, model_version_id=model_id,
                               action_text=text, started_at=made - timedelta(seconds=rng.uniform(2, 30)),
                               finished_at=made, created_at=made)  # fmt: skip
                else:
                    span = [i * 5.0, i * 5.0 + 2]
                    row.update(
                        action_text=candidates[0]["action_text"], action={"actions": [], "t": span}, created_at=made
                    )
                yield row

    copy_rows(Step, step_rows())
    log("  steps done; reviews…")
    reviewed = [
        r for r in traj_rows if r[4] in ("approved", "rejected") or (r[4] == "submitted" and rng.random() < 0.2)
    ]
    copy_rows(
        Review,
        (
            {"trajectory_id": pk, "reviewer_id": lead.pk, "verdict": "reject" if status == "rejected" else "approve"}
            for pk, _, _, _, status in reviewed
        ),
    )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def naive_live() -> dict[str, Any]:
    """The baseline: every figure counted live with the ORM, as a dashboard without aggregates would on each load."""
    from django.db.models import Avg, Count, Q

    from annotation_app.models import Review, Step, Task, Trajectory, User

    finished = ["submitted", "approved", "rejected"]
    out: dict[str, Any] = {"annotators": [], "models": {}, "coverage": {}}
    for user in User.objects.filter(trajectories__isnull=False).distinct().order_by("username"):
        mine = Trajectory.objects.filter(annotator=user)
        reviews = Review.objects.filter(trajectory__annotator=user)
        out["annotators"].append(
            {
                "user": user.username,
                "trajectories": mine.filter(status__in=finished).count(),
                "steps": Step.objects.filter(trajectory__annotator=user).count(),
                "reviewed": reviews.count(),
                "passed": reviews.filter(verdict="approve").count(),
                "gold": mine.filter(task__is_gold=True, status__in=finished).aggregate(Avg("outcome_reward")),
            }
        )
    for step in Step.objects.exclude(model_version=None).only(
        "model_version_id", "candidates", "chosen_candidate", "action_text"
    ):
        if not step.candidates:
            continue
        counts = out["models"].setdefault(step.model_version_id, {"accepted": 0, "edited": 0, "overridden": 0})
        if step.chosen_candidate is None:
            counts["overridden"] += 1
        elif step.candidates[step.chosen_candidate]["action_text"] == step.action_text:
            counts["accepted"] += 1
        else:
            counts["edited"] += 1
    live = Task.objects.exclude(status="archived")
    for dimension in ("domain", "platform", "difficulty"):
        out["coverage"][dimension] = list(
            live.values(dimension).annotate(n=Count("id"), done=Count("id", filter=Q(status="completed")))
        )
    out["coverage"]["status"] = list(Trajectory.objects.values("status").annotate(n=Count("id")))
    return out


def timings(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def http_page(env: dict[str, str], session: str, requests: int) -> list[float]:
    """p50/p95 source: the dashboard over HTTP through gunicorn (2 gthread workers, as the Procfile)."""
    sys.path.insert(0, str(ROOT))
    from tests.servers import answers, free_port

    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), "annotation_app.wsgi:application", "--bind",
               f"127.0.0.1:{port}", "--worker-class", "gthread", "--workers", "2", "--threads", "2"]  # fmt: skip
    log_file = open(ROOT / "var" / "bench-quality-gunicorn.log", "w")  # closed below
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        ready, deadline = answers(f"http://127.0.0.1:{port}/healthz"), time.monotonic() + 300
        while not ready():
            assert time.monotonic() < deadline and proc.poll() is None, "gunicorn did not come up"
            time.sleep(0.5)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/lead/quality/", headers={"Cookie": f"sessionid={session}"}
        )

        def get() -> None:
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200 and b"As of" in response.read()

        timings(get, 10)  # warm both workers
        return timings(get, requests)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log_file.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--trajectories", type=int, default=10_000)
    parser.add_argument("--annotators", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10, help="Steps per trajectory.")
    parser.add_argument("--requests", type=int, default=200, help="Page requests timed over HTTP and in-process.")
    parser.add_argument("--refreshes", type=int, default=3)
    parser.add_argument("--baseline", type=int, default=3, help="Live-count baseline runs.")
    parser.add_argument("--keep", action="store_true", help="Keep the bench database (and reuse it next time).")
    args = parser.parse_args()

    env = project_env()
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    with admin_connection(env) as conn:
        exists = conn.execute("select 1 from pg_database where datname = %s", [BENCH_DB]).fetchone()
    if not (args.keep and exists):
        create_database(env, BENCH_DB)
    import django

    django.setup()
    from django.contrib.sessions.backends.cached_db import SessionStore
    from django.test import Client

    from annotation_app.models import Task, Trajectory, User
    from annotation_app.quality import aggregates

    try:
        if not Task.objects.exists():
            log(f"seeding {args.tasks} tasks, {args.trajectories} trajectories x {args.steps} steps…")
            start = time.perf_counter()
            seed(args.tasks, args.trajectories, args.annotators, args.steps, random.Random(17))
            log(f"  seeded in {time.perf_counter() - start:.0f} s")
        sizes = (
            Task.objects.count(),
            Trajectory.objects.count(),
            User.objects.filter(username__startswith="ann-").count(),
        )
        load_before = os.getloadavg()[0]

        refresh_ms = timings(lambda: aggregates.refresh("bench"), args.refreshes)
        baseline_ms = timings(naive_live, args.baseline)

        lead = User.objects.get(username="quality-bench-lead")
        client = Client()
        client.force_login(lead)
        timings(lambda: client.get("/lead/quality/"), 5)  # templates compiled, connections open
        cpu_start = time.process_time()
        in_process_ms = timings(lambda: client.get("/lead/quality/"), args.requests)
        cpu_ms = (time.process_time() - cpu_start) * 1000 / args.requests
        from django.core.cache import cache

        def miss() -> None:
            cache.clear()  # this run's cache database: the next load renders the figures again
            client.get("/lead/quality/")

        miss_ms = timings(miss, max(5, args.requests // 10))
        session = SessionStore()
        backend = "django.contrib.auth.backends.ModelBackend"
        session.update(
            {
                "_auth_user_id": str(lead.pk),
                "_auth_user_backend": backend,
                "_auth_user_hash": lead.get_session_auth_hash(),
            }
        )
        session.create()
        http_ms = http_page(env, session.session_key, args.requests)
        load_after = os.getloadavg()[0]

        base_p50 = statistics.median(baseline_ms)
        rows = [
            ("dashboard over HTTP (gunicorn)", http_ms),
            ("dashboard in-process (view + template)", in_process_ms),
            ("dashboard in-process, figures not cached (first load after a refresh)", miss_ms),
            ("baseline: live ORM counts per load", baseline_ms),
            ("refresh (beat task's work)", refresh_ms),
        ]
        print()
        print(f"{sizes[0]:,} tasks, {sizes[1]:,} trajectories x {args.steps} steps, {sizes[2]} annotators; "
              f"load average {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
        print()
        print("| what | n | p50 ms | p95 ms | max ms | baseline p50 / p50 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for name, values in rows:
            ratio = base_p50 / statistics.median(values)
            print(f"| {name} | {len(values)} | {statistics.median(values):.0f} | {pct(values, 0.95):.0f} | "
                  f"{max(values):.0f} | {ratio:.1f}x |")  # fmt: skip
        print(f"\nin-process page: {cpu_ms:.0f} ms of this process's CPU per request (unaffected by waiting for a CPU)")
    finally:
        if not args.keep:
            drop_database(env, BENCH_DB)


if __name__ == "__main__":
    main()
