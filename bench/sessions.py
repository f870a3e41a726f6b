#!/usr/bin/env python3
"""Session manager figures (issue 3): cold vs warm-pool allocate, and 16 desktops held at once.

- allocate: lease + isolated user + desktop started on demand (cold, baseline) vs handed out from the warm pool
  (goals: cold <= 1 s, warm <= 20 ms);
- 16 sessions at once: memory per desktop (RSS of its Xvfb, openbox and x11vnc) and whether every one still answers
  (a click and a screenshot each).
Needs root (session users), X and bubblewrap, and Redis (`scripts/services start`).
Usage: .venv/bin/python bench/sessions.py [--rounds 5] [--hold 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sandbox.actions import Click, Point
from sandbox.isolation import isolation_available
from sandbox.leases import LeaseStore
from sandbox.manager import SessionManager

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63790") + "/11"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hold", type=int, default=16)
    args = parser.parse_args()
    if not isolation_available():
        sys.exit("needs root, bwrap, setpriv, prlimit and useradd")
    client = redis.Redis.from_url(REDIS_URL)
    namespace = f"bench-{uuid.uuid4().hex}"
    root = Path(tempfile.mkdtemp(prefix="bench-sessions-"))
    manager = SessionManager(LeaseStore(client, capacity=64, namespace=namespace), root, isolate=True)
    try:
        cold, warm = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            session = manager.allocate("bench", ttl_s=60)
            cold.append((time.perf_counter() - t0) * 1000)
            manager.release(session.session_id, "bench")
        manager.warm = 1
        for _ in range(args.rounds):
            manager.fill_warm_pool()
            t0 = time.perf_counter()
            session = manager.allocate("bench", ttl_s=60)
            warm.append((time.perf_counter() - t0) * 1000)
            manager.release(session.session_id, "bench")
        manager.warm = 0

        held = [manager.allocate(f"user{i}", ttl_s=120) for i in range(args.hold)]
        time.sleep(1)
        memory = [sum(rss_kib(p.pid) for p in s.desktop.processes.values()) / 1024 for s in held]
        answering = 0
        for s in held:
            s.desktop.execute(Click(Point(10, 10)))
            answering += bool(s.desktop.screenshot())
    finally:
        manager.shutdown()
        for key in client.scan_iter(f"{namespace}:*"):
            client.delete(key)

    cold_p50, warm_p50 = statistics.median(cold), statistics.median(warm)
    print(f"\nSession manager, {os.cpu_count()} cores, isolated users, 1280x800 desktops\n")
    print("| figure | value | vs baseline | goal |")
    print("|---|---|---|---|")
    print(f"| allocate, cold (baseline), p50 of {args.rounds} | {cold_p50:.1f} ms | 1.00x | <= 1000 ms: "
          f"{'yes' if cold_p50 <= 1000 else 'NO'} |")  # fmt: skip
    print(f"| allocate from the warm pool, p50 of {args.rounds} | {warm_p50:.2f} ms | {warm_p50 / cold_p50:.4f}x | "
          f"<= 20 ms: {'yes' if warm_p50 <= 20 else 'NO'} |")  # fmt: skip
    print(f"| {args.hold} desktops held: memory per desktop (median / max RSS) | {statistics.median(memory):.1f} / "
          f"{max(memory):.1f} MiB | | |")  # fmt: skip
    print(f"| {args.hold} desktops held: answering a click + screenshot | {answering} of {args.hold} | | "
          f"all: {'yes' if answering == args.hold else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    main()
