#!/usr/bin/env python3
"""Live-annotation figures (issue 4), measured against the running app (`./scripts/run` in another terminal).

1. Step overhead in real Chromium: accept a proposal (key 1-9) -> action executed in the sandbox -> new screenshot
   shown in the page (the next proposal request is sent before the answer; model time excluded). Baseline in the same
   run: the bare sandbox step (action + screenshot) through the sandbox client. Goal p50 <= 100 ms.
2. Proposals returned by the server -> candidates drawn in the page (server clock vs page clock, same machine).
3. Concurrent live sessions through the API: N annotators (default 8) each stepping every 2 s for D seconds (default
   300); every step answered 201 must be stored, with no 5xx; how often proposals were ready in time is reported.

Creates bench users/tasks in the app's database (prefixed bench-live-) and removes them afterwards.
Usage: source scripts/env.sh && .venv/bin/python bench/live.py [--steps 20] [--sessions 8] [--duration 300]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annotation_app.settings")
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API keeps a loop on this thread

import django  # noqa: E402

django.setup()

from rest_framework.authtoken.models import Token  # noqa: E402

from annotation_app.models import LiveSession, Role, Task, User  # noqa: E402
from annotation_app.task_queue import next_task  # noqa: E402
from sandbox.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402
from sandbox.client import SandboxClient  # noqa: E402

BASE = f"http://127.0.0.1:{os.environ.get('WEB_PORT', '8000')}"
PASSWORD = "bench-pass-123"
SETUP = [{"type": "launch", "parameters": {"command": ["xterm"]}}]


def usable(candidates: list[dict]) -> list[int]:
    """Proposals the benchmark accepts: valid ones that neither end the session nor sleep (wait() sleeps in the
    sandbox by design: that is the action's own time, not the platform's overhead)."""
    ending = ("finished", "call_user", "wait")
    return [i for i, c in enumerate(candidates) if not c["error"] and c["actions"][0]["type"] not in ending]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def row(name: str, values: list[float], baseline: float | None = None, goal: str = "") -> str:
    p50 = statistics.median(values) if values else float("nan")
    ratio = f"{p50 / baseline:.2f}x" if baseline else "1.00x (baseline)"
    return f"| {name} | {len(values)} | {p50:.1f} | {pct(values, 90):.1f} | {pct(values, 99):.1f} | {ratio} | {goal} |"


def annotator(name: str) -> tuple[User, str]:
    user, _ = User.objects.get_or_create(username=name, defaults={"role": Role.ANNOTATOR})
    user.set_password(PASSWORD)
    user.save()
    Task.objects.create(  # handed out before any other pending task
        instruction=f"Bench task for {name}: type in the terminal.", setup_config=SETUP, importance=32000
    )
    next_task(user)
    return user, Token.objects.get_or_create(user=user)[0].key


def bare_sandbox_steps(n: int) -> list[float]:
    """The baseline: action + screenshot straight through the sandbox service."""
    client = SandboxClient(os.environ["SANDBOX_URL"], os.environ["SANDBOX_API_KEY"], "bench-live-baseline")
    session = client.allocate(ttl_s=120)
    try:
        client.step(session["session_id"], "click(start_box='(10,10)')")  # warm
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            client.step(session["session_id"], f"click(start_box='({20 + i},{30 + i})')")
            times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        client.release(session["session_id"])
        client.close()


def browser_steps(steps: int) -> tuple[list[float], list[float], list[float]]:
    """Accept proposals in Chromium; returns step overheads, proposal->drawn latencies, model latencies (ms)."""
    from playwright.sync_api import sync_playwright

    user, _ = annotator("bench-live-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", *CHROMIUM_ARGS])
        page = browser.new_context(base_url=BASE).new_page()
        page.goto("/accounts/login/")
        page.fill("input[name=username]", user.username)
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.click("#annotate-live")
        page.wait_for_selector("#live[data-vnc=connected]", timeout=90_000)
        model_ms = []
        for index in range(steps):
            page.wait_for_selector(f"#live[data-proposals-for='{index}']", timeout=120_000)
            session = LiveSession.objects.filter(trajectory__annotator=user).latest("created_at")
            model_ms.append(float(session.proposal_latency_ms or 0))
            choices = usable(session.candidates)  # the candidates the page shows for this step
            if choices:
                page.keyboard.press(str(choices[0] + 1))
            else:
                page.fill("#override-action", "click(start_box='(40,40)')")
                page.wait_for_selector("#override-check.ok")
                page.click("#override-run")
            page.wait_for_function(f"window.liveTimings.steps.length > {index}", timeout=60_000)
        timings = page.evaluate("window.liveTimings")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#abandon")  # give the desktop back before the concurrency run
        page.wait_for_selector("#live[data-status=ended]")
        browser.close()
    overheads = [t["ms"] for t in timings["steps"]]
    drawn = [p["drawn"] - p["sent_at"] * 1000 for p in timings["proposals"] if p.get("sent_at")]
    return overheads, drawn, model_ms


def concurrent(sessions: int, duration: float) -> dict[str, float]:
    users = [annotator(f"bench-live-{n}") for n in range(sessions)]
    stats = {"ok": 0, "accepted": 0, "overridden": 0, "errors": 0, "server_errors": 0, "late": 0, "failed_to_start": 0}
    latencies: list[float] = []
    lock = threading.Lock()
    opened: list[int] = []

    def run(token: str) -> None:
        http = httpx.Client(base_url=BASE, headers={"Authorization": f"Token {token}"}, timeout=120)
        trajectory = http.post("/api/live/").json()["trajectory"]
        with lock:
            opened.append(trajectory)
        deadline = time.monotonic() + 120
        while (status := http.get(f"/api/live/{trajectory}/").json()["status"]) == "starting":
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if status != "active":
            with lock:
                stats["failed_to_start"] += 1
            print(f"session {trajectory} did not start: {http.get(f'/api/live/{trajectory}/').json()}", file=sys.stderr)
            return
        end = time.monotonic() + duration
        while time.monotonic() < end:
            tick = time.monotonic()
            state = http.get(f"/api/live/{trajectory}/").json()
            choices = usable(state["candidates"])
            if choices:
                body = {"expected_index": state["next_index"], "candidate": choices[0]}
            else:
                x, y = random.randrange(state["model_width"]), random.randrange(state["model_height"])
                body = {"expected_index": state["next_index"], "action_text": f"click(start_box='({x},{y})')"}
            t0 = time.perf_counter()
            response = http.post(f"/api/live/{trajectory}/step/", json=body)
            elapsed = (time.perf_counter() - t0) * 1000
            with lock:
                if response.status_code == 201:
                    stats["ok"] += 1
                    stats["accepted" if choices else "overridden"] += 1
                    stats["late"] += state["proposals"] != "ready"
                    latencies.append(elapsed)
                else:
                    stats["errors"] += 1
                    stats["server_errors"] += response.status_code >= 500
                    print(f"step answered {response.status_code}: {response.text[:200]}", file=sys.stderr)
            time.sleep(max(0.0, 2.0 - (time.monotonic() - tick)))
        http.post(f"/api/live/{trajectory}/end/", json={})
        http.close()

    threads = [threading.Thread(target=run, args=(token,)) for _, token in users]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    from annotation_app.models import Step

    stored = Step.objects.filter(trajectory_id__in=opened).count()
    return {
        **stats,
        "stored": stored,
        "lost": stats["ok"] - stored,
        "seconds": time.monotonic() - started,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": pct(latencies, 99),
    }


def cleanup() -> None:
    from annotation_app.live import sessions as live
    from annotation_app.models import Trajectory

    users = User.objects.filter(username__startswith="bench-live-")
    for session in LiveSession.objects.filter(trajectory__annotator__in=users, status__in=["starting", "active"]):
        live.end_live(session, "abandoned")  # releases the sandbox lease
    Trajectory.objects.filter(annotator__in=users).delete()
    Task.objects.filter(instruction__startswith="Bench task for bench-live-").delete()
    users.delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--duration", type=float, default=300)
    args = parser.parse_args()
    httpx.get(f"{BASE}/healthz").raise_for_status()
    cleanup()
    try:
        baseline = bare_sandbox_steps(args.steps)
        overheads, drawn, model_ms = browser_steps(args.steps)
        print("\n| figure | n | p50 ms | p90 ms | p99 ms | p50 vs bare sandbox step | goal |")
        print("|---|---|---|---|---|---|---|")
        print(row("bare sandbox step (action + screenshot)", baseline))
        print(
            row(
                "live step: accept -> executed -> new screenshot shown",
                overheads,
                statistics.median(baseline),
                "p50 <= 100 ms",
            )
        )
        print(row("proposals sent by the server -> drawn in the page", drawn, statistics.median(baseline)))
        print(row("model time per proposal batch (excluded above)", model_ms, statistics.median(baseline)))
        if args.sessions:
            result = concurrent(args.sessions, args.duration)
            print(
                f"\n{args.sessions} sessions ({result['failed_to_start']} failed to start), one step each per 2 s, "
                f"{result['seconds']:.0f} s:"
            )
            print(
                "| steps answered 201 | stored | lost | errors (5xx) | accepted | overridden | proposals late | "
                "step p50 ms | step p99 ms |\n|---|---|---|---|---|---|---|---|---|"
            )
            print(
                f"| {result['ok']} | {result['stored']} | {result['lost']} | {result['errors']} "
                f"({result['server_errors']}) | {result['accepted']} | {result['overridden']} | {result['late']} | "
                f"{result['p50']:.1f} | {result['p99']:.1f} |"
            )
    finally:
        cleanup()


if __name__ == "__main__":
    main()
