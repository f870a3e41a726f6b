#!/usr/bin/env python3
"""The data lead's trajectory player (/lead/trajectories/<id>/) with a 50-step trajectory: p50/p95/p99 of the page,
and of the preview check an action edit makes, against the plain trajectory page (/trajectories/<id>/, every
screenshot in a column) measured in the same run, alternating request by request so that load hits both alike.

In process (Django's test client: the view, templates, ORM and PostgreSQL, no HTTP server), on a database of its
own (test_<DATABASE_NAME>, kept between runs with --keepdb). Every step has a screenshot, three model proposals,
and a verdict and an edit on every fifth step, so the player draws what a reviewed live trajectory has.

Usage (after `scripts/services start`): source scripts/env.sh && DATABASE_NAME=annotation_bench_review \
    .venv/bin/python bench/review_page.py [--steps 50] [--rounds 200] [--keepdb]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annotation_app.settings_test")
os.environ.setdefault("TEST_MEDIA_ROOT", tempfile.mkdtemp(prefix="bench-review-media-"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def seed(steps: int) -> tuple[object, int]:
    """A data lead and a submitted 50-step live trajectory with screenshots, proposals, verdicts and edits."""
    from django.core.files.base import ContentFile
    from django.utils import timezone
    from PIL import Image

    from annotation_app import step_edits
    from annotation_app.models import Role, Step, Task, Trajectory, User

    lead = User.objects.create_user("bench-lead", password="pw", role=Role.DATA_LEAD)
    annotator = User.objects.create_user("bench-annotator", password="pw", role=Role.ANNOTATOR)
    trajectory = Trajectory.objects.create(
        task=Task.objects.create(instruction="Fill in the form and save it."), annotator=annotator,
        mode=Trajectory.Mode.INTERACTIVE, status=Trajectory.Status.SUBMITTED, submitted_at=timezone.now(),
        screen_width=1280, screen_height=800,
    )  # fmt: skip
    out = io.BytesIO()
    Image.new("RGB", (1280, 800), (40, 120, 200)).save(out, format="PNG")
    png = out.getvalue()
    for i in range(steps):
        action = f"click(start_box='({100 + i * 10},{200 + i * 5})')"
        candidates = [
            {"thought": f"Proposal {n} for step {i}.", "action_text": action, "actions": [{"type": "click",
             "point": [100 + i * 10 + n, 200]}], "points": [[100 + i * 10 + n, 200]], "raw": "", "error": "",
             "model": "bench"}
            for n in range(3)
        ]  # fmt: skip
        step = Step(
            trajectory=trajectory, index=i, thought=f"I click the field number {i}.", action_text=action,
            candidates=candidates, chosen_candidate=0, model_latency_ms=700,
        )  # fmt: skip
        step.screenshot.save(f"{i}.png", ContentFile(png), save=False)
        step.save()
        if i % 5 == 0:
            step_edits.set_verdict(step, lead, "ok")
            step_edits.edit_thought(step, lead, f"The field number {i} comes first.")
    return lead, trajectory.pk


def measure(call: Callable[[], int], samples: list[float]) -> None:
    start = time.perf_counter()
    status = call()
    samples.append((time.perf_counter() - start) * 1000)
    if status != 200:
        raise SystemExit(f"a request answered {status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--keepdb", action="store_true", help="keep the bench database for the next run")
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from annotation_app.models import Trajectory, User

    setup_test_environment()
    name = connection.creation.create_test_db(verbosity=0, keepdb=args.keepdb)
    try:
        Trajectory.objects.filter(annotator__username="bench-annotator").delete()  # a kept database's last run
        User.objects.filter(username__startswith="bench-").delete()
        lead, pk = seed(args.steps)
        client = Client()
        client.force_login(lead)
        player, plain = f"/lead/trajectories/{pk}/", f"/trajectories/{pk}/"
        check = f"/lead/trajectories/{pk}/steps/7/check/"
        calls: dict[str, Callable[[], int]] = {
            "plain": lambda: client.get(plain).status_code,
            "player": lambda: client.get(player).status_code,
            "check": lambda: client.post(check, {"action": "click(start_box='(640,400)')"}).status_code,
        }
        sizes, queries = {}, {}
        for key, call in calls.items():
            for _ in range(10):  # warm-up: templates compiled, connections open
                call()
            with CaptureQueriesContext(connection) as captured:
                call()
            queries[key] = len(captured)
        sizes["plain"], sizes["player"] = len(client.get(plain).content), len(client.get(player).content)
        samples: dict[str, list[float]] = {key: [] for key in calls}
        for _ in range(args.rounds):
            for key, call in calls.items():
                measure(call, samples[key])
    finally:
        connection.creation.destroy_test_db(name, verbosity=0, keepdb=args.keepdb)

    base = percentile(samples["plain"], 0.95)
    print(f"\nReview page, {args.steps}-step trajectory, {args.rounds} rounds alternating, in process (load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")  # fmt: skip
    print("| request | p50 ms | p95 ms | p99 ms | p95 / plain page p95 | queries | bytes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    labels = {
        "plain": "GET /trajectories/<id>/ (baseline: plain page, screenshots in a column)",
        "player": "GET /lead/trajectories/<id>/ (the player)",
        "check": "POST …/steps/7/check/ (action preview)",
    }
    for key, label in labels.items():
        values = samples[key]
        p50, p95, p99 = (percentile(values, q) for q in (0.5, 0.95, 0.99))
        size = f"{sizes[key]:,}" if key in sizes else "—"
        print(f"| {label} | {p50:.1f} | {p95:.1f} | {p99:.1f} | {p95 / base:.2f}x | {queries[key]} | {size} |")
    print(f"\nmedian of the plain page {statistics.median(samples['plain']):.1f} ms")


if __name__ == "__main__":
    main()
