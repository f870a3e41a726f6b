"""The flywheel demonstration's results, computed from the database alone (never from the run's memory): per
iteration the held-out success with 95 % Wilson intervals per family and overall, the share of new trajectories
routed to SFT, the acceptance rate of the model's proposals by the simulated annotators, and trajectories and wall
time per stage. A demonstration is found by its root, the untrained agent (`flywheel.demo.untrained_agent`): its
iterations are those whose base model descends from it. Also its JSON and its PNG (matplotlib)."""

from __future__ import annotations

import io
import itertools
import json
import re
from datetime import datetime
from typing import Any

from django.db.models import Q

from annotation_app.models import Step, Task, Trajectory
from training.evaluate import wilson_interval

from .models import DatasetVersion, Iteration, ModelVersion, Validation

ROOT_PREFIX = "demo-agent"  # flywheel.demo.ROOT_PREFIX (kept here so the report's page never imports the runner)
STAGE_ORDER = (
    "drills", "demonstrations", "annotation", "rft", "validate", "export", "ct", "sft", "value", "ppo", "evaluate",
)  # fmt: skip


def roots() -> list[ModelVersion]:
    """Every demonstration's untrained agent, newest first."""
    return list(ModelVersion.objects.filter(name__startswith=ROOT_PREFIX + "-", parent=None).order_by("-id"))


def lineage(root: ModelVersion) -> list[ModelVersion]:
    """The root and every model descending from it (through `parent`)."""
    found, frontier = [root], [root.pk]
    while frontier:
        children = list(ModelVersion.objects.filter(parent_id__in=frontier).order_by("id"))
        found += children
        frontier = [m.pk for m in children]
    return found


def iterations_of(root: ModelVersion) -> list[Iteration]:
    """The demonstration's iterations, in the order they were started: those whose base descends from the root."""
    ids = [m.pk for m in lineage(root)]
    return list(Iteration.objects.filter(base_model_id__in=ids).select_related("base_model").order_by("created_at"))


def rate(successes: int, n: int) -> dict[str, Any]:
    """A success rate with its 95 % Wilson interval."""
    low, high = wilson_interval(successes, n) if n else (0.0, 1.0)
    return {"successes": successes, "n": n, "rate": successes / n if n else None, "ci_low": low, "ci_high": high}


def _family(task: Task | None, key: str) -> str:
    if task is not None and (task.metadata or {}).get("suite"):
        return str(task.metadata["suite"])
    return key.split("-heldout-")[0].removeprefix("suite-") if "-heldout-" in key else key


def _level(task: Task | None, key: str) -> str:
    if task is not None and (task.metadata or {}).get("difficulty") is not None:
        return str(task.metadata["difficulty"])
    found = re.search(r"-d(\d+)(?:@|$)", key)  # the suite's external ids end in -d<level> (@<run> in a demonstration)
    return found.group(1) if found else "?"


def heldout(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """An evaluation result ({by_task: {external id: {episodes, successes}}}) by family, by difficulty level and
    overall."""
    if not result:
        return None
    by_task = result.get("by_task") or {}
    tasks = {t.external_id: t for t in Task.objects.filter(external_id__in=list(by_task))}
    families: dict[str, list[int]] = {}
    levels: dict[str, list[int]] = {}
    for key, counts in by_task.items():
        for tally in (families.setdefault(_family(tasks.get(key), key), [0, 0]),
                      levels.setdefault(_level(tasks.get(key), key), [0, 0])):  # fmt: skip
            tally[0] += int(counts.get("successes", 0))
            tally[1] += int(counts.get("episodes", 0))
    total = [sum(t[0] for t in families.values()), sum(t[1] for t in families.values())]
    if isinstance(result.get("episodes"), int) and isinstance(result.get("successes"), int):
        total = [result["successes"], result["episodes"]]  # the evaluation's own counts
    return {"overall": rate(*total), "by_family": {f: rate(*t) for f, t in sorted(families.items())},
            "by_level": {level: rate(*t) for level, t in sorted(levels.items())}}  # fmt: skip


def acceptance(trajectory_ids: list[int]) -> dict[str, Any]:
    """Steps with model proposals in these trajectories: accepted as proposed (a candidate chosen) or overridden."""
    steps = Step.objects.filter(trajectory_id__in=trajectory_ids).exclude(candidates=[]).exclude(status=Step.Status.CUT)
    total = steps.count()
    accepted = steps.filter(chosen_candidate__isnull=False).count()
    return {**rate(accepted, total), "accepted": accepted, "overridden": total - accepted}


def _span(rows: list[tuple[datetime | None, datetime | None]]) -> float | None:
    starts = [a for a, _ in rows if a]
    ends = [b for _, b in rows if b]
    return round((max(ends) - min(starts)).total_seconds(), 1) if starts and ends else None


def _origin(trajectory: dict[str, Any]) -> str:
    origin = (trajectory["metadata"] or {}).get("origin")
    if origin == "demo":
        return "demonstrations"
    if origin == "rft":
        return "rft"
    return "annotation" if trajectory["mode"] == Trajectory.Mode.INTERACTIVE else str(trajectory["mode"])


def trained_rows(iteration: Iteration, version: DatasetVersion | None) -> int | None:
    """The SFT trajectories the iteration trained on: its store version's rows, only those of versions made since
    `train.store_since` when it is set (the demonstration's own data, not the shared store's)."""
    from .training_stages import trained_versions

    if version is None:
        return None
    if ((iteration.config or {}).get("train") or {}).get("store_since") is None:
        return version.row_count
    return sum(trained_versions(iteration, version).values_list("added_count", flat=True))


def iteration_row(iteration: Iteration, number: int) -> dict[str, Any]:
    """One iteration's figures, from its row, its validations, its trajectories and its store versions."""
    stages = iteration.stages or {}
    validated = list(
        Validation.objects.filter(iteration=iteration).values(
            "route", "trajectory_id", "trajectory__mode", "trajectory__metadata", "trajectory__created_at",
            "trajectory__submitted_at", "trajectory__simulated",
        )
    )  # fmt: skip
    by_origin: dict[str, dict[str, Any]] = {}
    for row in validated:
        origin = _origin({"metadata": row["trajectory__metadata"], "mode": row["trajectory__mode"]})
        entry = by_origin.setdefault(origin, {"routes": {}, "ids": [], "times": []})
        entry["routes"][row["route"]] = entry["routes"].get(row["route"], 0) + 1
        entry["ids"].append(row["trajectory_id"])
        entry["times"].append((row["trajectory__created_at"], row["trajectory__submitted_at"]))
    sft = sum(1 for row in validated if row["route"] == "sft")
    annotated = by_origin.get("annotation", {}).get("ids", [])
    per_stage: dict[str, dict[str, Any]] = {}
    for origin in ("demonstrations", "annotation"):
        if origin in by_origin:
            found = by_origin[origin]
            per_stage[origin] = {"trajectories": len(found["ids"]), "seconds": _span(found["times"])}
    versions = {v.kind: v for v in DatasetVersion.objects.filter(iteration=iteration)}
    evaluate = (stages.get("evaluate") or {}).get("output") or {}
    counts = {
        "rft": ((stages.get("rft") or {}).get("output") or {}).get("attempts"),
        "validate": len(validated),
        "export": sum(v.added_count for v in versions.values()),
        "sft": trained_rows(iteration, versions.get("sft")),
        "evaluate": sum(
            int(played.get("episodes", 0))
            for played in (evaluate.get(side) or {} for side in ("new", "parent"))
            if "reused_from_iteration" not in played
        )
        or None,  # a reused result was not played again
    }
    for name in iteration.selected_stages:
        entry = stages.get(name) or {}
        per_stage[name] = {"trajectories": counts.get(name), "seconds": entry.get("seconds"),
                           "status": entry.get("status")}  # fmt: skip
    model = ModelVersion.objects.filter(pk=evaluate.get("model_id")).first()
    # the demonstrations or the annotation ran before the iteration's row was started: its wall time begins with them
    before = [by_origin[origin]["times"] for origin in ("demonstrations", "annotation") if origin in by_origin]
    began = [made for times in before for made, _ in times if made] + [iteration.started_at]
    return {
        "number": number,
        "iteration": iteration.pk,
        "status": iteration.status,
        "base_model": iteration.base_model.name if iteration.base_model else None,
        "model": model.name if model else None,
        "promoted": evaluate.get("promoted"),
        "promotion": ((model.evaluation or {}).get("promotion") or {}).get("reason") if model else None,
        "heldout": heldout(evaluate.get("new")),
        "heldout_base": heldout(evaluate.get("parent")),
        "new_trajectories": len(validated),
        "sft_share": rate(sft, len(validated)),
        "routes_by_origin": {o: e["routes"] for o, e in sorted(by_origin.items())},
        "acceptance": acceptance(annotated) if annotated else None,
        "stages": {s: per_stage[s] for s in STAGE_ORDER if s in per_stage},
        "wall_s": round((iteration.finished_at - min(began)).total_seconds(), 1)
        if iteration.finished_at and iteration.started_at
        else None,
    }


def against(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """The success goal of a later held-out result over iteration 0's: the ratio, doubled, 95 % intervals apart."""
    rates = first["rate"], later["rate"]
    return {
        "ratio": (rates[1] / rates[0]) if rates[0] else None,
        "doubled": bool(None not in rates and rates[1] >= 2 * rates[0] and rates[1] > 0),
        "intervals_apart": later["ci_low"] > first["ci_high"],
    }


TIME_GOAL_S = {False: 3600.0, True: 600.0}  # the full plan's hour, the --quick plan's ten minutes (issue 16)


def rising(parts: list[dict[str, Any] | None], key: str, within_ci: bool = False) -> bool | None:
    """Whether a rate rose across the loop's iterations (iteration 0, the bootstrap, is left out): each at least
    the one before and the last above the first; None with fewer than two iterations that measured it.
    `within_ci` reads "at least" as the success goal does: each one's 95 % interval reaches the rate before it."""
    measured = [(part[key], part["n"]) for part in parts[1:] if part and part.get("n")]
    if len(measured) < 2:
        return None
    rates = [k / n for k, n in measured]
    tops = [wilson_interval(k, n)[1] for k, n in measured] if within_ci else rates
    return all(top >= before for before, top in zip(rates, tops[1:], strict=False)) and rates[-1] > rates[0]


def with_drills(root: ModelVersion, rows: list[dict[str, Any]]) -> float:
    """Put the grounding drills (run before the root was registered, so before any iteration) in iteration 0's
    stages and wall time; returns their seconds (0 without drills)."""
    drills = (root.metrics or {}).get("drills") or {}
    seconds = float(drills.get("seconds") or 0.0)
    if rows and seconds:
        first = rows[0]
        first["stages"] = {"drills": {"trajectories": None, "seconds": seconds, "status": "done"}, **first["stages"]}
        first["wall_s"] = round(first["wall_s"] + seconds, 1) if first["wall_s"] is not None else None
    return seconds


def build_report(root: ModelVersion) -> dict[str, Any]:
    """The demonstration of `root` as one JSON-ready dict (the page, the PNG and report.json all draw on it)."""
    iterations = iterations_of(root)
    rows = [iteration_row(it, n) for n, it in enumerate(iterations)]
    plan: dict[str, Any] = {}
    if "plan " in root.notes:
        try:
            plan = json.loads(root.notes.split("plan ", 1)[1])
        except ValueError:
            plan = {}
    first = rows[0]["heldout"]["overall"] if rows and rows[0]["heldout"] else None
    last = rows[-1]["heldout"]["overall"] if rows and rows[-1]["heldout"] else None
    stamps = [it.started_at for it in iterations if it.started_at] + [root.created_at]
    ends = [it.finished_at for it in iterations if it.finished_at]
    drills_s = with_drills(root, rows)
    goals = None
    if first and last and len(rows) > 1:
        kept = next((row for row in reversed(rows) if row["promoted"] and row["heldout"]), rows[0])
        goals = {
            **against(first, last),
            "monotone_within_ci": all(
                b["heldout"]["overall"]["ci_high"] >= a["heldout"]["overall"]["rate"]
                for a, b in itertools.pairwise(rows) if a["heldout"] and b["heldout"]
            ),
            # what the loop leaves serving: the last promoted model (a worse one is never promoted)
            "kept": {"number": kept["number"], **against(first, kept["heldout"]["overall"])},
            "sft_share_rising": rising([row["sft_share"] for row in rows], "successes"),
            "acceptance_rising": rising([row["acceptance"] for row in rows], "accepted"),
            # the same, noise-aware: a dip inside the later measure's own interval does not count
            "sft_share_rising_within_ci": rising([row["sft_share"] for row in rows], "successes", within_ci=True),
            "acceptance_rising_within_ci": rising([row["acceptance"] for row in rows], "accepted", within_ci=True),
        }  # fmt: skip
    wall_s = round((max(ends) - min(stamps)).total_seconds() + drills_s, 1) if ends else None
    if goals is not None:
        limit = TIME_GOAL_S[bool(plan.get("quick"))]
        goals.update(time_limit_s=limit, within_time=None if wall_s is None else wall_s <= limit)
    return {
        "root": root.name,
        "root_id": root.pk,
        "plan": plan,
        "untrained": rows[0]["heldout_base"] if rows else None,
        "iterations": rows,
        "goals": goals,
        "wall_s": wall_s,
        "simulated_trajectories": Trajectory.objects.filter(Q(simulated=True), validations__iteration__in=iterations)
        .distinct()
        .count(),
    }


def _pct(value: float | None) -> float:
    return 100.0 * value if value is not None else float("nan")


def plot_png(report: dict[str, Any]) -> bytes:
    """Three panels: held-out success per iteration (overall with its 95 % interval, and per family), the SFT share
    and the acceptance rate, and wall time per stage."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [r for r in report["iterations"]]
    xs = [r["number"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.4))
    ax = axes[0]
    overall = [r["heldout"]["overall"] if r["heldout"] else None for r in rows]
    ys = [_pct(o["rate"]) if o else float("nan") for o in overall]
    low = [y - _pct(o["ci_low"]) if o else 0 for y, o in zip(ys, overall, strict=True)]
    high = [_pct(o["ci_high"]) - y if o else 0 for y, o in zip(ys, overall, strict=True)]
    ax.errorbar(xs, ys, yerr=[low, high], fmt="o-", color="black", capsize=4, label="overall (95 % CI)", zorder=3)
    families = sorted({f for r in rows if r["heldout"] for f in r["heldout"]["by_family"]})
    for name in families:
        values = [_pct((r["heldout"]["by_family"].get(name) or {}).get("rate")) if r["heldout"] else float("nan")
                  for r in rows]  # fmt: skip
        ax.plot(xs, values, ".--", alpha=0.6, label=name)
    if report.get("untrained"):
        drills = (report.get("plan") or {}).get("drills")
        label = f"untrained + {drills} drills" if drills else "untrained"
        ax.axhline(_pct(report["untrained"]["overall"]["rate"]), color="grey", lw=0.8, ls=":", label=label)
    ax.set(title="Held-out success", xlabel="iteration", ylabel="%", ylim=(-2, 102))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: never over a line
    ax = axes[1]
    ax.plot(xs, [_pct(r["sft_share"]["rate"]) for r in rows], "s-", label="new trajectories routed to SFT")
    ax.plot(xs, [_pct((r["acceptance"] or {}).get("rate")) for r in rows], "^-", label="proposals accepted")
    ax.set(title="Routing and acceptance", xlabel="iteration", ylabel="%", ylim=(-2, 102))
    ax.legend(fontsize=7)
    ax = axes[2]
    bottom = [0.0] * len(rows)
    for stage in STAGE_ORDER:
        seconds = [float((r["stages"].get(stage) or {}).get("seconds") or 0.0) for r in rows]
        if any(seconds):
            ax.bar(xs, seconds, bottom=bottom, label=stage)
            bottom = [b + s for b, s in zip(bottom, seconds, strict=True)]
    ax.set(title="Wall time per stage", xlabel="iteration", ylabel="s")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in axes:
        ax.set_xticks(xs)
    fig.suptitle(f"Flywheel demonstration {report['root']}")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()
