"""The flywheel demonstration's figures across runs (issue 16): per run and iteration, held-out success with its 95 %
interval and its ratio to the same run's iteration 0 (the baseline), the SFT share of new trajectories, the
acceptance of proposals, promotion and wall time; then, for runs of the same plan and seed, the spread of each
iteration's success rate (the reproducibility noise). With `--by family` or `--by level`, each run's held-out
successes per family or per difficulty level across its iterations follow.

    python bench/demo_runs.py var/demo/*/report.json [--by family|level]

It reads the report.json files `manage.py flywheel demo` writes (flywheel/demo_report.py); it runs nothing itself.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def _held(row: dict[str, Any]) -> dict[str, Any]:
    return (row.get("heldout") or {}).get("overall") or {}


def run_rows(report: dict[str, Any]) -> list[list[str]]:
    """One table row per iteration of a report."""
    rows = report.get("iterations") or []
    first = _held(rows[0]).get("rate") if rows else None
    out = []
    for row in rows:
        held, share, accepted = _held(row), row.get("sft_share") or {}, row.get("acceptance") or {}
        rate = held.get("rate")
        ratio = f"{rate / first:.2f}" if rate is not None and first else ("—" if rate is None else "∞" if rate else "—")
        out.append([
            report.get("root", "?"), str(row.get("number")),
            f"{held.get('successes', 0)}/{held.get('n', 0)}" if held else "—",
            f"[{held.get('ci_low', 0):.2f}, {held.get('ci_high', 1):.2f}]" if held else "—",
            ratio,
            f"{share.get('successes', 0)}/{share.get('n', 0)}" if share else "—",
            f"{accepted.get('accepted', 0)}/{accepted.get('n', 0)}" if accepted else "—",
            str(row.get("promoted")), f"{row.get('wall_s') or 0:.0f}",
        ])  # fmt: skip
    return out


def breakdown_rows(report: dict[str, Any], by: str) -> tuple[list[str], list[list[str]]]:
    """A report's held-out successes per family or level (rows) and iteration (columns); empty when not recorded."""
    iterations = report.get("iterations") or []
    parts = [(row.get("heldout") or {}).get(f"by_{by}") or {} for row in iterations]
    keys = sorted({str(key) for part in parts for key in part})
    header = [by, *(f"it {row.get('number')}" for row in iterations)]
    rows = []
    for key in keys:
        cells = []
        for part in parts:
            cell = part.get(key)
            cells.append(f"{cell['successes']}/{cell['n']}" if cell else "—")
        rows.append([key, *cells])
    return header, rows


def spread(reports: list[dict[str, Any]]) -> list[list[str]]:
    """For each (plan, iteration) seen in more than one run: the runs' success rates, their range and mean."""
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for report in reports:
        key = json.dumps(report.get("plan") or {}, sort_keys=True)
        for row in report.get("iterations") or []:
            rate = _held(row).get("rate")
            if rate is not None:
                groups[(key, int(row.get("number", 0)))].append(float(rate))
    out = []
    for (key, number), rates in sorted(groups.items()):
        if len(rates) < 2:
            continue
        plan = json.loads(key)
        label = f"seed {plan.get('seed')} {'quick' if plan.get('quick') else 'full'}"
        out.append([label, str(number), str(len(rates)), " ".join(f"{r:.2f}" for r in rates),
                    f"{max(rates) - min(rates):.2f}", f"{sum(rates) / len(rates):.2f}"])  # fmt: skip
    return out


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="report.json files of demonstration runs")
    parser.add_argument("--by", choices=["family", "level"], help="also print held-out successes per family or level")
    args = parser.parse_args()
    reports = [json.loads(path.read_text()) for path in args.reports]
    rows = [row for report in reports for row in run_rows(report)]
    print(table(["run", "it", "held-out", "95 % CI", "× it 0", "→ SFT", "accepted", "promoted", "wall s"], rows))
    for report in reports:
        goals = report.get("goals") or {}
        print(f"{report.get('root')}: {report.get('wall_s')} s in all; goals {json.dumps(goals)}")
    for report in reports if args.by else []:
        header, breakdown = breakdown_rows(report, args.by)
        print(f"\n{report.get('root')}: held-out successes per {args.by}")
        print(table(header, breakdown) if breakdown else f"(this report has no per-{args.by} figures)")
    same = spread(reports)
    if same:
        print()
        print(table(["plan", "it", "runs", "success rates", "range", "mean"], same))


if __name__ == "__main__":
    main()
