#!/usr/bin/env python3
"""Live-annotation figures (issue 4), measured against the running app (`./scripts/run` in another terminal).

1. Step overhead in real Chromium: accept a proposal (key 1-9; or, with --override, run a typed click at once
   without waiting for the model) -> action executed in the sandbox -> new screenshot shown in the page (the next
   proposal request is sent before the answer; model time excluded). Baselines in the same run: the bare sandbox
   step (action + settle + screenshot) through the service's HTTP API, and a CPU reference (JPEG-encoding one
   model-size frame in this process) that tells how loaded the machine was. Goal: the overhead over the bare
   sandbox step p50 <= 100 ms, printed as live p50 - bare p50 and paired per step (the page's time minus that
   step's own time in the sandbox service). The first --warmup steps are not measured.
   Each part is broken down from the Server-Timing headers of the step requests (the web app's and the sandbox
   service's), and the CPU time of the app's processes (web, websockets, sandbox service with its desktops) per
   step is read from /proc around each phase.
2. Proposals returned by the server -> candidates drawn in the page (server clock vs page clock, same machine).
3. Concurrent live sessions through the API: N annotators (default 8) each stepping every 2 s for D seconds (default
   300); every step answered 201 must be stored, with no 5xx; how often proposals were ready in time is reported.

Creates bench users/tasks in the app's database (prefixed bench-live-) and removes them afterwards.
Usage: source scripts/env.sh && .venv/bin/python bench/live.py [--steps 20] [--sessions 8] [--duration 300]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
from PIL import Image

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


def row(name: str, values: list[float], baselines: tuple[float, ...] = (), goal: str = "") -> str:
    """A table row: n, p50, p90, p99, then the p50 against each baseline (a baseline's own row says 1.00x)."""
    p50 = statistics.median(values) if values else float("nan")
    ratios = " | ".join(f"{p50 / b:.2f}x" if b else "" for b in baselines)
    return f"| {name} | {len(values)} | {p50:.1f} | {pct(values, 90):.1f} | {pct(values, 99):.1f} | {ratios} | {goal} |"


def annotator(name: str) -> tuple[User, str]:
    user, _ = User.objects.get_or_create(username=name, defaults={"role": Role.ANNOTATOR})
    user.set_password(PASSWORD)
    user.save()
    Task.objects.create(  # handed out before any other pending task
        instruction=f"Bench task for {name}: type in the terminal.", setup_config=SETUP, importance=32000
    )
    next_task(user)
    return user, Token.objects.get_or_create(user=user)[0].key


def reference_encodes(n: int) -> list[float]:
    """The CPU reference: JPEG q80 of one model-size (1288x812) frame in this process, ms each."""
    noise = Image.frombytes("RGB", (1288, 812), random.Random(7).randbytes(1288 * 812 * 3))
    frame = noise.reduce(4).resize((1288, 812))  # smooth, like a screen, not noise
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        frame.save(io.BytesIO(), "JPEG", quality=80)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def stack_processes() -> dict[str, list[psutil.Process]]:
    """The app's processes by part, found by the ports they listen on, with their children (gunicorn's workers; the
    sandbox service's desktops, browsers and Playwright drivers)."""
    parts = {"web": os.environ.get("WEB_PORT", "8000"), "websockets": os.environ.get("WS_PORT", "8001")}
    parts["sandbox"] = os.environ.get("SANDBOX_PORT", "8010")
    owners: dict[int, set[int]] = {}  # every process holding the listening socket (gunicorn's workers share it)
    for c in psutil.net_connections("tcp"):
        if c.status == "LISTEN" and c.pid:
            owners.setdefault(c.laddr.port, set()).add(c.pid)
    found = {}
    for name, port in parts.items():
        processes: dict[int, psutil.Process] = {}
        for pid in owners.get(int(port), ()):
            root = psutil.Process(pid)
            while root.parent() is not None and int(port) in _listening(root.parent()):
                root = root.parent()  # up to the master: its workers are its children
            processes.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        if processes:
            found[name] = list(processes.values())
    return found


def _listening(process: psutil.Process) -> set[int]:
    try:
        return {c.laddr.port for c in process.net_connections("tcp") if c.status == "LISTEN"}
    except psutil.Error:
        return set()


def cpu_seconds(parts: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """User + system CPU seconds so far of each part's processes (children that exited are counted by their
    parents only once reaped; desktops and workers live through a phase)."""
    total: dict[str, float] = {}
    for name, processes in parts.items():
        seconds = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
                seconds += times.user + times.system
            except psutil.Error:
                pass
        total[name] = seconds
    return total


def cpu_per_step(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    return {name: (after[name] - before.get(name, 0.0)) * 1000 / max(steps, 1) for name in after}


def bare_sandbox_steps(n: int, *, in_app: bool = False) -> tuple[list[float], list[dict[str, float]]]:
    """The baseline: click + settle + screenshot straight through the service's HTTP API; wall ms and the service's
    own breakdown (its Server-Timing) of each step. The clicks land on the bare desktop, or with `in_app` in a
    maximized terminal (input that reaches an application: the settle wait cannot skip its grace)."""
    client = SandboxClient(os.environ["SANDBOX_URL"], os.environ["SANDBOX_API_KEY"], "bench-live-baseline")
    session = client.allocate(ttl_s=120)
    sid = session["session_id"]
    if in_app:
        client.setup(sid, [{"type": "launch", "parameters": {"command": ["xterm", "-maximized"]}}])
    http = httpx.Client(
        base_url=os.environ["SANDBOX_URL"], headers={"Authorization": f"Bearer {os.environ['SANDBOX_API_KEY']}"}
    )
    try:
        client.step(sid, "click(start_box='(10,10)')")  # warm
        times, parts = [], []
        for i in range(n):
            body = {"owner": "bench-live-baseline", "action_text": f"click(start_box='({20 + i},{30 + i})')"}
            t0 = time.perf_counter()
            response = http.post(f"/sessions/{sid}/step", json=body)
            response.raise_for_status()
            times.append((time.perf_counter() - t0) * 1000)
            parts.append(server_timing(response.headers.get("server-timing", "")))
        return times, parts
    finally:
        http.close()
        client.release(sid)
        client.close()


def server_timing(header: str) -> dict[str, float]:
    """{name: ms} of a Server-Timing header ("a;dur=1.0, b;dur=2")."""
    parts = {}
    for item in header.split(","):
        name, _, rest = item.strip().partition(";")
        if rest.startswith("dur="):
            parts[name] = float(rest[4:])
    return parts


RESOURCES = """() => performance.getEntriesByType("resource").map((e) => ({
  name: e.name, start: e.startTime, ms: e.duration,
  server: Object.fromEntries((e.serverTiming || []).map((t) => [t.name, t.duration])),
}))"""


def browser_steps(
    steps: int, *, override: bool, parts: dict[str, list[psutil.Process]] | None = None, warmup: int = 0
) -> dict:
    """Take `warmup` then `steps` steps in Chromium (accepting proposals, or with `override` a typed click at once);
    per measured step the page's wall time, the step request's server breakdown, the new screenshot's load time when
    the page fetched it; proposal->drawn and model latencies when proposals were awaited; the CPU time per step of
    `parts` over the measured steps alone. The warm-up steps reach every web worker once (a worker's first request
    imports the views), as a running app's workers are."""
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
        page.wait_for_selector("#live[data-vnc=connected]", timeout=180_000)
        page.evaluate("performance.setResourceTimingBufferSize(100000)")
        model_ms = []
        cpu_before = cpu_seconds(parts or {})
        for index in range(warmup + steps):
            if index == warmup:
                cpu_before, model_ms = cpu_seconds(parts or {}), []
            page.wait_for_selector(f"#live[data-next-index='{index}']", state="attached", timeout=60_000)
            choices: list[int] = []
            if not override:
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
        cpu = cpu_per_step(cpu_before, cpu_seconds(parts or {}), steps)
        timings = page.evaluate("window.liveTimings")
        resources = page.evaluate(RESOURCES)
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#abandon")  # give the desktop back before the concurrency run
        page.wait_for_selector("#live[data-status=ended]")
        browser.close()
    requests = [r for r in resources if "/api/live/" in r["name"] and "/step/" in r["name"]][warmup:]
    # Screenshots the page fetched by URL (the opening one; later ones only when a step's answer had none inline).
    images = [r for r in resources if "/obs-" in r["name"] and r["start"] >= requests[0]["start"]] if requests else []
    return {
        "page": [t["ms"] for t in timings["steps"] if t["index"] >= warmup],
        "request": [r["ms"] for r in requests],
        "server": [r["server"] for r in requests],
        "image": [r["ms"] for r in images],
        "drawn": [
            p["drawn"] - p["sent_at"] * 1000 for p in timings["proposals"] if p.get("sent_at") and p["index"] > warmup
        ],
        "model": model_ms,
        "cpu": cpu,
    }


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


def breakdown(server: list[dict[str, float]], request: list[float]) -> dict[str, list[float]]:
    """Per part of the live step request, ms per step: the web app's own parts, the sandbox round trip split into
    the service's settle wait and the rest of its work, and what the network, the view and DRF add."""
    parts: dict[str, list[float]] = {}
    for timing, total in zip(server, request, strict=False):
        if not timing:
            continue
        service = timing.get("service", 0.0)
        known = {
            "reserve (row lock, 'executing' step, its screenshot copied)": timing.get("reserve", 0.0),
            "sandbox: settle wait": timing.get("settle", 0.0),
            "sandbox: action + screenshot + JSON in the service": service - timing.get("settle", 0.0),
            "sandbox: HTTP + base64/JSON in the web app": timing.get("sandbox", 0.0) - service,
            "complete (row lock, step done, observation written)": timing.get("complete", 0.0),
            "push (channel layer)": timing.get("push", 0.0),
            "enqueue (Celery, next proposals)": timing.get("enqueue", 0.0),
        }
        parts_sum = timing.get("reserve", 0.0) + timing.get("sandbox", 0.0) + timing.get("complete", 0.0)
        parts_sum += timing.get("push", 0.0) + timing.get("enqueue", 0.0)
        known["view rest (auth, session lookup, JSON)"] = timing.get("view", 0.0) - parts_sum
        known["network + gunicorn + browser fetch"] = total - timing.get("view", 0.0)
        known["web worker CPU of the request (thread time)"] = timing.get("cpu", 0.0)
        for name, ms in known.items():
            parts.setdefault(name, []).append(ms)
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4, help="live steps taken first and not measured")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--duration", type=float, default=300)
    parser.add_argument(
        "--override", action="store_true", help="step with a typed click at once instead of awaiting proposals"
    )
    args = parser.parse_args()
    httpx.get(f"{BASE}/healthz").raise_for_status()
    cleanup()
    try:
        reference = reference_encodes(args.steps)
        parts = stack_processes()
        before = cpu_seconds(parts)
        baseline, service_parts = bare_sandbox_steps(args.steps)
        bare_cpu = cpu_per_step(before, cpu_seconds(parts), args.steps)
        in_app, in_app_parts = bare_sandbox_steps(args.steps, in_app=True)
        live_run = browser_steps(args.steps, override=args.override, parts=stack_processes(), warmup=args.warmup)
        live_cpu = live_run["cpu"]
        ref = statistics.median(reference)
        bare = statistics.median(baseline)
        print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; ratios against the CPU reference")
        print("\n| figure | n | p50 ms | p90 ms | p99 ms | p50 vs CPU reference | p50 vs bare sandbox step | goal |")
        print("|---|---|---|---|---|---|---|---|")

        def line(name: str, values: list[float], goal: str = "") -> None:
            print(row(name, values, (ref, bare), goal))

        line("CPU reference: JPEG q80 of a 1288x812 frame (this process)", reference)
        line("bare sandbox step: click + settle + screenshot over HTTP", baseline)
        for name in ("execute", "settle", "screenshot", "encode", "cpu"):
            line(f"  service: {name}", [p.get(name, 0.0) for p in service_parts])
        line("sandbox step into an application (a maximized xterm)", in_app)
        line("  service: settle", [p.get("settle", 0.0) for p in in_app_parts])
        line("live step: accept -> executed -> new screenshot shown", live_run["page"], "overhead p50 <= 100 ms")
        line("  the step request (fetch)", live_run["request"])
        for name, values in breakdown(live_run["server"], live_run["request"]).items():
            line(f"    {name}", values)
        if live_run["image"]:
            line("  the new screenshot's load (fetch by URL)", live_run["image"])
        live_p50 = statistics.median(live_run["page"])
        overhead = live_p50 - bare
        print(f"\nlive step p50 {live_p50:.1f} ms - bare sandbox step p50 {bare:.1f} ms = overhead {overhead:.1f} ms")
        paired = [ms - t.get("service", 0.0) for ms, t in zip(live_run["page"], live_run["server"], strict=False)]
        print(
            f"paired, per live step (page time - that step's own time in the sandbox service): p50 "
            f"{statistics.median(paired):.1f} ms, p90 {pct(paired, 90):.1f} ms"
        )
        print(
            f"(against the step into an application, p50 {statistics.median(in_app):.1f} ms: "
            f"{live_p50 - statistics.median(in_app):.1f} ms); goal: overhead p50 <= 100 ms"
        )
        if live_run["drawn"]:
            line("proposals sent by the server -> drawn in the page", live_run["drawn"])
        if live_run["model"]:
            line("model time per proposal batch (excluded above)", live_run["model"])
        print("\nCPU time per step (ms, user + system, all processes of each part over the step loop, from /proc):")
        print("| part | bare sandbox steps | live steps |\n|---|---|---|")
        for name in sorted(set(bare_cpu) | set(live_cpu)):
            print(f"| {name} | {bare_cpu.get(name, 0.0):.1f} | {live_cpu.get(name, 0.0):.1f} |")
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
