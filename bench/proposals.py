#!/usr/bin/env python3
"""What greedy-first live proposals cost (LIVE_GREEDY_FIRST): the latency of one step's candidates from the embedded
policy server, all sampled (one request, n candidates) against the greedy answer plus n-1 sampled (two requests sent
together), alternating in the same run so both see the same machine. The server runs as the Procfile starts it, on
the suite agent (var/models/suite-agent) when it is cached, else on the tiny random checkpoint built from its config.

Usage: .venv/bin/python bench/proposals.py [--rounds 12] [--n 4] [--max-tokens 256] [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import io
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image, ImageDraw
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.coordinates import ScreenMapping  # noqa: E402
from training.policy.client import PolicyClient  # noqa: E402
from training.policy.prompts import build_messages  # noqa: E402
from training.policy.tiny import build_tiny_checkpoint  # noqa: E402

MODES = ("all sampled", "greedy first")


def screenshot(width: int, height: int) -> bytes:
    """A page-like model-size frame: a few labelled buttons on a light background."""
    image = Image.new("RGB", (width, height), (242, 242, 238))
    draw = ImageDraw.Draw(image)
    for n, label in enumerate(("Mute", "Move", "Open")):
        x, y = 300 + 180 * n, 200 + 90 * n
        draw.rectangle((x, y, x + 90, y + 28), outline=(40, 40, 40), fill=(255, 255, 255))
        draw.text((x + 24, y + 8), label, fill=(0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(checkpoint: Path, name: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(checkpoint), "--name", name,
               "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the policy server did not come up; its log: {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12, help="steps measured per mode")
    parser.add_argument("--n", type=int, default=4, help="candidates per step (LIVE_CANDIDATES)")
    parser.add_argument("--max-tokens", type=int, default=256, help="LIVE_MAX_TOKENS")
    parser.add_argument("--checkpoint", type=Path, default=None)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-proposals-"))
    checkpoint = args.checkpoint or ROOT / "var" / "models" / "suite-agent"
    if not (checkpoint / "config.json").is_file():
        checkpoint = Path(build_tiny_checkpoint(tmp / "tiny-uitars"))
    proc, url = serve(checkpoint, "bench", tmp / "policy.log")
    width, height = ScreenMapping(1280, 800).model_size
    messages = build_messages("Click the button labelled 'Open'.", [], screenshot(width, height))
    client = PolicyClient(url, "bench", timeout_s=600)
    latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
    valid: dict[str, int] = dict.fromkeys(MODES, 0)
    try:
        client.propose(messages, width=width, height=height, n=args.n, max_tokens=args.max_tokens)  # warm-up
        for r in tqdm(range(args.rounds), desc="rounds", unit="round"):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:  # alternate which goes first
                batch = client.propose(messages, width=width, height=height, n=args.n, seed=r,
                                       max_tokens=args.max_tokens, greedy_first=mode == "greedy first")  # fmt: skip
                latencies[mode].append(batch.latency_ms)
                valid[mode] += sum(p.valid for p in batch.proposals)
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)

    base = statistics.median(latencies[MODES[0]])
    print(f"\ncheckpoint {checkpoint}, {args.n} candidates, max_tokens {args.max_tokens}, {args.rounds} steps each\n")
    print("| mode | p50 ms | p90 ms | mean ms | × all sampled (p50) | valid candidates |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        values = sorted(latencies[mode])
        p90 = values[min(len(values) - 1, round(0.9 * (len(values) - 1)))]
        print(f"| {mode} | {statistics.median(values):.0f} | {p90:.0f} | {statistics.fmean(values):.0f} | "
              f"{statistics.median(values) / base:.2f} | {valid[mode]}/{args.n * args.rounds} |")  # fmt: skip


if __name__ == "__main__":
    main()
