#!/usr/bin/env python3
"""Step round trip through the sandbox service (issue 3): action executed and new observation returned.

The service runs as its own process (uvicorn, as `python -m sandbox.service`); the client sends a click and gets
back the JPEG at the model's size. Baseline: the same click + screenshot called in-process on a desktop, in the
same run. Goal: p50 <= 100 ms through the API. Needs root, X, bubblewrap and Redis (`scripts/services start`).
Usage: .venv/bin/python bench/service.py [--steps 50]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from sandbox.actions import Click, Point  # noqa: E402
from sandbox.client import SandboxClient  # noqa: E402
from sandbox.coordinates import ScreenMapping  # noqa: E402
from sandbox.desktop import Desktop  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-service-"))

    desktop = Desktop.start(root / "baseline")
    try:
        size = ScreenMapping(desktop.width, desktop.height).model_size
        baseline = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            desktop.execute(Click(Point(100 + i, 100)))
            desktop.screenshot(size)
            baseline.append((time.perf_counter() - t0) * 1000)
    finally:
        desktop.stop()

    port, key = free_port(), uuid.uuid4().hex
    env = {
        **os.environ, "SANDBOX_API_KEY": key, "SANDBOX_PORT": str(port), "SANDBOX_ROOT": str(root / "sessions"),
        "SANDBOX_REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:63790") + "/11",
        "SANDBOX_NAMESPACE": f"bench-{key[:8]}", "SANDBOX_WARM": "0", "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    service = subprocess.Popen(
        [sys.executable, "-m", "sandbox.service"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/docs", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or service.poll() is not None:
                    sys.exit("the service did not start")
                time.sleep(0.1)
        client = SandboxClient(f"http://127.0.0.1:{port}", key, owner="bench")
        sid = client.allocate(ttl_s=300)["session_id"]
        client.step(sid, "wait()", observe=False)
        api = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            result = client.step(sid, f"click(start_box='({100 + i},100)')")
            assert result.observation_jpeg
            api.append((time.perf_counter() - t0) * 1000)
        client.release(sid)
        client.close()
    finally:
        service.terminate()
        service.wait(timeout=30)

    base_p50, api_p50 = statistics.median(baseline), statistics.median(api)
    setup = f"{args.steps} steps, {os.cpu_count()} cores"
    print(f"\nStep round trip (click + observation at the model's size, JPEG), {setup}\n")
    print("| path | p50 ms | p99 ms | p50 vs in-process | goal |")
    print("|---|---|---|---|---|")
    print(
        f"| in-process execute + screenshot (baseline) | {base_p50:.1f} | {percentile(baseline, 0.99):.1f} | 1.00x | |"
    )
    print(f"| through the service API (HTTP + JSON + base64) | {api_p50:.1f} | {percentile(api, 0.99):.1f} | "
          f"{api_p50 / base_p50:.2f}x | p50 <= 100 ms: {'yes' if api_p50 <= 100 else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    main()
