#!/usr/bin/env python3
"""Lease operations per second with 8 concurrent clients (goal >= 2,000/s on 2 cores), against the real Redis.

Each client process loops acquire -> renew -> release (3 operations) for --duration seconds. The baseline is the
same clients sending 3 PINGs per loop: the round-trip floor of this Redis on this machine, measured in the same run.
Usage (after `scripts/services start`): .venv/bin/python bench/leases.py [--clients 8] [--duration 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sandbox.leases import LeaseStore

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:63790") + "/11"
GOAL_OPS = 2000


def worker(kind: str, namespace: str, duration: float, start: float, out: mp.Queue) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    store = LeaseStore(client, capacity=10_000, namespace=namespace)
    while time.time() < start:
        time.sleep(0.001)
    loops, latencies = 0, []
    deadline = start + duration
    while time.time() < deadline:
        t0 = time.perf_counter()
        if kind == "leases":
            lease = store.acquire("bench", ttl_s=30)
            store.renew(lease.session_id, "bench")
            store.release(lease.session_id, "bench")
        else:
            client.ping()
            client.ping()
            client.ping()
        latencies.append(time.perf_counter() - t0)
        loops += 1
    out.put((loops, latencies))


def run(kind: str, clients: int, duration: float) -> dict[str, float]:
    namespace = f"bench-{uuid.uuid4().hex}"
    out: mp.Queue = mp.Queue()
    start = time.time() + 0.5
    procs = [mp.Process(target=worker, args=(kind, namespace, duration, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    loops = sum(r[0] for r in results)
    latencies = sorted(x for r in results for x in r[1])
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{namespace}:*"):
        client.delete(key)
    return {
        "ops_per_s": 3 * loops / duration,
        "p50_ms": 1000 * latencies[len(latencies) // 2] / 3,
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] / 3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    baseline = run("ping", args.clients, args.duration)
    leases = run("leases", args.clients, args.duration)
    setup = f"{args.clients} concurrent client processes, {args.duration:.0f} s each, {os.cpu_count()} cores"
    print(f"\nLease operations, {setup}\n")
    print("| workload | ops/s | p50 ms/op | p99 ms/op | ops/s vs PING baseline | goal >= 2,000 ops/s |")
    print("|---|---|---|---|---|---|")
    for name, r in [("PING x3 (baseline)", baseline), ("acquire + renew + release", leases)]:
        ok = "yes" if r["ops_per_s"] >= GOAL_OPS else "**NO**"
        ratio = r["ops_per_s"] / baseline["ops_per_s"]
        print(f"| {name} | {r['ops_per_s']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {ratio:.2f}x | {ok} |")


if __name__ == "__main__":
    main()
