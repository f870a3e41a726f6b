#!/usr/bin/env python3
"""Sandbox desktop figures (issue 3), one table, one run: cold start, observation capture, action injection.

- cold start: Desktop.start() until the VNC port answers, bare (baseline) and with the wallpaper and panel the
  sandbox now shows (goal <= 1 s);
- settle: how long an observation waits for the screen after a keystroke a terminal echoes (sandbox.settle);
- capture at 1280x800: grab alone (baseline), grab + JPEG, grab + JPEG at the model's size, grab + PNG
  (goal p50 <= 15 ms);
- injection: a click through this process's XTEST connection vs one `xdotool` process per click (goal >= 10x faster).
Usage: .venv/bin/python bench/desktop.py [--shots 100] [--clicks 200] [--starts 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sandbox.actions import Click, Point, Type
from sandbox.coordinates import ScreenMapping
from sandbox.desktop import Desktop


def timed(fn, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def cold_start(home: Path, panel: bool = True) -> float:
    t0 = time.perf_counter()
    desktop = Desktop.start(home, panel=panel)
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as vnc:
                vnc.connect(str(desktop.vnc_socket))
            break
        except OSError:
            time.sleep(0.005)
    elapsed = (time.perf_counter() - t0) * 1000
    desktop.stop()
    return elapsed


def settle_after_typing(desktop: Desktop, n: int) -> list[float]:
    """How long an observation waits for the screen after a keystroke that a terminal echoes (sandbox.settle)."""
    desktop.launch(["xterm", "-geometry", "80x10+0+0"])
    deadline = time.monotonic() + 20
    while not any(cls == "XTerm" for cls, _ in desktop.windows()) and time.monotonic() < deadline:
        time.sleep(0.05)
    desktop.execute(Click(Point(100, 60)))
    samples = []
    for i in range(n):
        desktop.execute(Type("x" if i % 40 else "\n"))
        samples.append(desktop.settle().waited_ms)
    return samples


def row(name: str, samples: list[float], baseline: float | None, goal: str) -> str:
    p50 = statistics.median(samples)
    p99 = sorted(samples)[int(len(samples) * 0.99) - 1] if len(samples) > 1 else samples[0]
    ratio = f"{p50 / baseline:.3g}x" if baseline else "1.00x"
    return f"| {name} | {len(samples)} | {p50:.2f} | {p99:.2f} | {ratio} | {goal} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shots", type=int, default=100)
    parser.add_argument("--clicks", type=int, default=200)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-desktop-"))

    bare, starts = [], []
    for i in range(args.starts):  # alternating, so both see the same machine
        bare.append(cold_start(root / f"bare{i}", panel=False))
        starts.append(cold_start(root / f"home{i}"))
    desktop = Desktop.start(root / "home")
    try:
        size = ScreenMapping(desktop.width, desktop.height).model_size
        region = {"left": 0, "top": 0, "width": desktop.width, "height": desktop.height}
        grab = timed(lambda: desktop.grabber.grab(region), args.shots)
        jpeg = timed(lambda: desktop.screenshot(), args.shots)
        jpeg_model = timed(lambda: desktop.screenshot(size), args.shots)
        png = timed(lambda: desktop.screenshot(fmt="png"), args.shots)
        xtest = timed(lambda: desktop.execute(Click(Point(200, 200))), args.clicks)
        settle = settle_after_typing(desktop, args.shots)
        env = desktop.env()
        xdotool = timed(
            lambda: subprocess.run(["xdotool", "mousemove", "200", "200", "click", "1"], env=env, check=True),
            args.clicks,
        )
    finally:
        desktop.stop()

    start_p50, grab_p50, xdotool_p50 = statistics.median(starts), statistics.median(grab), statistics.median(xdotool)
    print(f"\nSandbox desktop, {desktop.width}x{desktop.height}, model image {size[0]}x{size[1]}\n")
    print("| figure | samples | p50 ms | p99 ms | p50 vs baseline | goal |")
    print("|---|---|---|---|---|---|")
    print(row("cold start, bare (Xvfb + openbox + x11vnc answering; baseline)", bare, None, ""))
    print(
        row(
            "cold start with wallpaper and panel (tint2 on screen)",
            starts,
            statistics.median(bare),
            f"<= 1000 ms: {'yes' if start_p50 <= 1000 else 'NO'}",
        )
    )
    print(row("settle after typing a key into xterm (XDAMAGE, 50 ms quiet)", settle, None, "added to each step"))
    print(row("grab only (baseline)", grab, None, ""))
    for name, samples in [
        ("grab + JPEG q80", jpeg),
        ("grab + resize to model size + JPEG", jpeg_model),
        ("grab + PNG (level 1)", png),
    ]:
        p50 = statistics.median(samples)
        print(row(name, samples, grab_p50, f"p50 <= 15 ms: {'yes' if p50 <= 15 else 'NO'}"))
    print(row("click, one xdotool process (baseline)", xdotool, None, ""))
    speedup = xdotool_p50 / statistics.median(xtest)
    print(
        row(
            "click, in-process XTEST",
            xtest,
            xdotool_p50,
            f">= 10x faster: {speedup:.0f}x {'yes' if speedup >= 10 else 'NO'}",
        )
    )


if __name__ == "__main__":
    main()
