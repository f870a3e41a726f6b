#!/usr/bin/env python3
"""Deduplication over the store (annotation_app.curation.dedup): trajectories signed and grouped per second, with
their screenshots hashed (JPEG, 1280x800), and the cost of one more trajectory as the store grows (signatures of
other tasks and other action sequences bulk-inserted: the (task, action_key) index keeps it flat).

In process, on a database of its own (test_<DATABASE_NAME>, --keepdb keeps it). A fifth of the trajectories are
near copies of another one (same actions, points 3 px off, the same screens re-encoded), so groups form.

Usage (after `scripts/services start`): source scripts/env.sh && DATABASE_NAME=annotation_bench_curation \
    .venv/bin/python bench/curation.py [--trajectories 300] [--steps 5] [--store 1000 10000 100000]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annotation_app.settings_test")
os.environ.setdefault("TEST_MEDIA_ROOT", tempfile.mkdtemp(prefix="bench-curation-media-"))


def screen(seed: int, quality: int = 80) -> bytes:
    """A 1280x800 JPEG with boxes placed by `seed`."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", (1280, 800), "white")
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x, y = rng.randrange(0, 1100), rng.randrange(0, 700)
        draw.rectangle((x, y, x + rng.randrange(40, 300), y + rng.randrange(20, 150)),
                       fill=tuple(rng.randrange(256) for _ in range(3)))  # fmt: skip
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def seed_store(count: int, steps: int) -> list[int]:
    """`count` submitted trajectories over count/5 tasks; every fifth is a near copy of the one before it."""
    from django.core.files.base import ContentFile

    from annotation_app.models import Step, Task, Trajectory

    tasks = [Task.objects.create(instruction=f"bench task {n}") for n in range(max(1, count // 5))]
    ids = []
    for n in range(count):
        copy = n % 5 == 4
        base = n - 1 if copy else n
        trajectory = Trajectory.objects.create(
            task=tasks[base % len(tasks)], mode=Trajectory.Mode.INTERACTIVE, status=Trajectory.Status.SUBMITTED,
            screen_width=1280, screen_height=800,
        )  # fmt: skip
        for i in range(steps):
            data = screen(base * 100 + i, quality=60 if copy else 80)
            x = 100 + (base * 37 + i * 53) % 1000 + (3 if copy else 0)
            step = Step(trajectory=trajectory, index=i, action_text=f"click(start_box='({x},{200 + i * 40})')",
                        screenshot_sha256=hashlib.sha256(data).hexdigest())  # fmt: skip
            step.screenshot.save("s.jpg", ContentFile(data), save=False)
            step.save()
        ids.append(trajectory.pk)
    return ids


def grow(to: int) -> None:
    """Bulk signatures (no images) of other tasks' trajectories until the store holds `to`."""
    from annotation_app.curation.models import TrajectorySignature
    from annotation_app.models import Task, Trajectory

    have = TrajectorySignature.objects.count()
    if have >= to:
        return
    task = Task.objects.create(instruction="filler")
    batch = 5000
    for start in range(have, to, batch):
        n = min(batch, to - start)
        rows = Trajectory.objects.bulk_create(
            Trajectory(task=task, mode=Trajectory.Mode.INTERACTIVE, status=Trajectory.Status.SUBMITTED)
            for _ in range(n)
        )
        TrajectorySignature.objects.bulk_create(
            TrajectorySignature(
                trajectory=t, task=task, action_key=f"{t.pk:064x}", points=[[[0.1, 0.2]]], hashes=["0" * 16], digest=""
            )
            for t in rows
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=300)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--store", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--rounds", type=int, default=30, help="re-dedups of one trajectory per store size")
    parser.add_argument("--keepdb", action="store_true")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from annotation_app.curation.dedup import dedup_pending, dedup_trajectory
    from annotation_app.curation.models import DuplicateGroup

    setup_test_environment()
    name = connection.creation.create_test_db(verbosity=0, keepdb=args.keepdb)
    try:
        clock = time.perf_counter()
        ids = seed_store(args.trajectories, args.steps)
        seeded = time.perf_counter() - clock
        clock = time.perf_counter()
        counts = dedup_pending(args.trajectories)
        took = time.perf_counter() - clock
        print(f"seeded {len(ids)} trajectories x {args.steps} steps in {seeded:.1f} s")
        print("| pass | trajectories | groups | seconds | trajectories/s | ms/trajectory |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        print(f"| sign + group (pHash of every screenshot) | {counts['checked']} | {DuplicateGroup.objects.count()} | "
              f"{took:.2f} | {counts['checked'] / took:.1f} | {took * 1000 / counts['checked']:.1f} |")  # fmt: skip
        probe = ids[-1]
        head = "| signatures in store | one trajectory re-signed, p50 ms | p95 ms | queries | SQL ms (last) |"
        print(f"\n{head}")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for size in args.store:
            grow(size)
            times = []
            for _ in range(args.rounds):
                with CaptureQueriesContext(connection) as queries:
                    clock = time.perf_counter()
                    dedup_trajectory(probe, resign=True)
                    times.append((time.perf_counter() - clock) * 1000)
            times.sort()
            p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
            sql = sum(float(q["time"]) for q in queries.captured_queries) * 1000
            print(f"| {size:,} | {statistics.median(times):.1f} | {p95:.1f} | {len(queries)} | {sql:.1f} |")
    finally:
        connection.creation.destroy_test_db(name, verbosity=0, keepdb=args.keepdb)


if __name__ == "__main__":
    main()
