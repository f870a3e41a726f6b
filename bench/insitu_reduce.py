#!/usr/bin/env python3
"""In-situ event reduction throughput: a recorder's event log parsed and reduced to UI-TARS actions.

A recorder session is mostly pointer motion (60 Hz), and a long one runs to millions of events. A seeded synthetic
1,000,000-event log shaped like a real session (pointer moves at 60 Hz while the hand moves, clicks, double and right
clicks, drags, typing bursts with typos and backspaces, hotkeys, scroll gestures, a pre-action screenshot before every
action, window changes, pauses). Rows: json.loads of every line (the baseline: the floor cost of reading the log),
orjson.loads of every line (the decoder parse_lines uses, json.loads behind it for the lines orjson refuses),
events.parse_lines (parse, check, order), reduce.reduce_events on the parsed events, and both; events/s, median of
--repeat. Goal >= 200,000 events/s. The reduction is checked against the actions the generator made (same counts per
action type). Events per CPU-second of this process sit beside the wall-clock figures: they hold up when others share
the machine. Needs no database.

Usage: source scripts/env.sh && .venv/bin/python bench/insitu_reduce.py [--events 1000000] [--repeat 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from insitu_common import GOAL_EVENTS_S, MB, SyntheticSession, jsonl, log, machine_line, reduced_counts, run, warn

from annotation_app.insitu.events import parse_lines
from annotation_app.insitu.reduce import reduce_events


def median_rate(fn: Callable[[], Any], events: int, repeat: int) -> tuple[tuple[float, float], Any]:
    """(events per wall second, events per CPU second of this process), medians of `repeat` runs; the last result."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        result = None
        gc.collect()
        started, started_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return (events / statistics.median(wall), events / statistics.median(cpu)), result


def table_reduction(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    log(f"generating a session of {args.events:,}+ events (seed {args.seed})")
    session = SyntheticSession.of_events(args.seed, args.events)
    n = len(session.events)
    kinds = Counter(e["type"] for e in session.events)
    blob = jsonl(session.events)
    span, expected = session.events[-1]["t"], session.expected
    del session
    gc.collect()

    def read() -> list[Any]:
        return [json.loads(line) for line in io.BytesIO(blob)]

    def read_orjson() -> list[Any]:
        return [orjson.loads(line) for line in io.BytesIO(blob)]

    def parse() -> Any:
        return parse_lines(io.BytesIO(blob))

    log("json.loads / orjson.loads / parse_lines / reduce_events / both, median of " + str(args.repeat))
    base_rate = median_rate(read, n, args.repeat)[0]  # results dropped at once: no extra objects for the GC
    orjson_rate = median_rate(read_orjson, n, args.repeat)[0]
    parse_rate, parsed = median_rate(parse, n, args.repeat)
    reduce_rate, reduction = median_rate(lambda events=parsed.events: reduce_events(events), n, args.repeat)
    del parsed
    both_rate = median_rate(lambda: reduce_events(parse().events), n, args.repeat)[0]
    got = reduced_counts(reduction.actions)
    info = {
        "events": n,
        "mb": len(blob) / MB,
        "span_h": span / 3600,
        "moves": kinds["move"] / n,
        "kinds": kinds,
        "actions": len(reduction.actions),
        "warnings": reduction.warnings,
        "expected": expected,
        "got": got,
        "reduced_right": got == expected,
    }
    rows = [
        ("`json.loads` of every line (baseline: reading the log)", base_rate, ""),
        ("`orjson.loads` of every line (the decoder parse_lines uses)", orjson_rate, ""),
        ("`events.parse_lines` (parse + check + order)", parse_rate, f">= {GOAL_EVENTS_S:,}"),
        ("`reduce.reduce_events` on the parsed events", reduce_rate, f">= {GOAL_EVENTS_S:,}"),
        ("parse + reduce", both_rate, f">= {GOAL_EVENTS_S:,}"),
    ]
    lines = [
        "| step | events/s | vs baseline | goal | met | events/CPU-s | vs baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (rate, cpu_rate), goal in rows:
        met = "" if not goal else ("yes" if rate >= GOAL_EVENTS_S else "**NO**")
        lines.append(
            f"| {name} | {rate:,.0f} | {rate / base_rate[0]:.2f}x | {goal} | {met} | {cpu_rate:,.0f} | "
            f"{cpu_rate / base_rate[1]:.2f}x |"
        )
    return "\n".join(lines), info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the throughput log")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs; the median counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(machine_line(args.seed))
    failed = False
    table, info = table_reduction(args)
    print(f"### Event reduction throughput ({info['events']:,} events, median of {args.repeat})\n")
    kinds = ", ".join(f"{k} {v:,}" for k, v in info["kinds"].most_common())
    print(f"Synthetic log: {info['mb']:.0f} MB of JSON Lines, {info['span_h']:.1f} h of session, "
          f"{info['moves']:.0%} pointer moves; {kinds}; reduced to {info['actions']:,} actions.\n")  # fmt: skip
    print(table + "\n")
    expected = ", ".join(f"{k} {v}" for k, v in sorted(info["expected"].items()))
    print(f"Reduction check, {sum(info['expected'].values()):,} actions generated: "
          f"{'as generated' if info['reduced_right'] else 'WRONG'} ({expected}).\n")  # fmt: skip
    if not info["reduced_right"]:
        warn(f"reduce_events gave {dict(info['got'])}, the generator made {dict(info['expected'])}")
        failed = True
    if info["warnings"]:
        print(f"Reduction warnings: {info['warnings'][:3]}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    run(main)
