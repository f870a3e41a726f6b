"""What the quality pages show, read from the precomputed aggregates only (a few hundred rows), and their CSV form."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, time, timedelta
from functools import cached_property
from typing import Any

from django.utils import timezone

from . import aggregates
from .models import AnnotatorStats, Coverage, ModelAcceptance, Throughput

PLOT_DAYS = 90  # the throughput plot's window
CACHE_S = 3600  # the rendered figures, cached per refresh (a new refresh has a new key)


class UnknownTable(LookupError):
    """A CSV was asked for a table the dashboard does not have."""


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# Each table: (column header, how to read it from a row).
Columns = list[tuple[str, Callable[[Any], Any]]]

ANNOTATOR_COLUMNS: Columns = [
    ("annotator", lambda r: r.username),
    ("trajectories", lambda r: r.trajectories),
    ("steps", lambda r: r.steps),
    ("trajectories_per_hour", lambda r: _round(r.trajectories_per_hour)),
    ("steps_per_hour", lambda r: _round(r.steps_per_hour)),
    ("trajectories_per_day", lambda r: _round(r.trajectories_per_day)),
    ("steps_per_day", lambda r: _round(r.steps_per_day)),
    ("median_s_per_step", lambda r: _round(r.median_step_s, 1)),
    ("reviewed", lambda r: r.reviewed),
    ("review_pass_pct", lambda r: _pct(r.pass_rate)),
    ("gold_scored", lambda r: r.gold_scored),
    ("gold_accuracy_pct", lambda r: _pct(r.gold_accuracy)),
    ("peer_tasks", lambda r: r.peer_tasks),
    ("peer_outcome_agreement_pct", lambda r: _pct(r.peer_outcome)),
    ("peer_first_step_agreement_pct", lambda r: _pct(r.peer_first_step)),
    ("peer_similarity", lambda r: _round(r.peer_similarity, 3)),
]
THROUGHPUT_COLUMNS: Columns = [
    ("day", lambda r: r.day.isoformat()),
    ("annotator", lambda r: r.annotator.username if r.annotator_id else "(everyone)"),
    ("trajectories", lambda r: r.trajectories),
    ("steps", lambda r: r.steps),
]
ACCEPTANCE_COLUMNS: Columns = [
    ("model", lambda r: r.model_name),
    ("action_type", lambda r: r.action_type or "(all)"),
    ("proposals", lambda r: r.proposals),
    ("accepted", lambda r: r.accepted),
    ("edited", lambda r: r.edited),
    ("overridden", lambda r: r.overridden),
    ("accepted_pct", lambda r: _pct(r.acceptance_rate)),
    ("edited_pct", lambda r: _pct(r.edited_rate)),
    ("overridden_pct", lambda r: _pct(r.overridden_rate)),
]
COVERAGE_COLUMNS: Columns = [
    ("dimension", lambda r: r.dimension),
    ("value", lambda r: r.key),
    ("count", lambda r: r.count),
    ("completed_tasks", lambda r: r.completed if r.dimension != Coverage.Dimension.TRAJECTORY_STATUS else ""),
]


def annotator_rows() -> list[AnnotatorStats]:
    return list(AnnotatorStats.objects.order_by("username"))


def acceptance_rows() -> list[ModelAcceptance]:
    return list(ModelAcceptance.objects.order_by("model_created_at", "model_version_id", "action_type"))


def throughput_rows() -> Iterable[Throughput]:
    return Throughput.objects.select_related("annotator").order_by("day", "annotator__username")


def coverage_rows() -> list[Coverage]:
    return list(Coverage.objects.order_by("dimension", "-count", "key"))


TABLES: dict[str, tuple[Callable[[], Iterable[Any]], Columns]] = {
    "annotators": (annotator_rows, ANNOTATOR_COLUMNS),
    "throughput": (throughput_rows, THROUGHPUT_COLUMNS),
    "acceptance": (acceptance_rows, ACCEPTANCE_COLUMNS),
    "coverage": (coverage_rows, COVERAGE_COLUMNS),
}


def table_csv(name: str) -> str:
    """One dashboard table as CSV text, header first; UnknownTable for a name not in TABLES."""
    if name not in TABLES:
        raise UnknownTable(f"There is no table '{name}': one of {', '.join(TABLES)}.")
    rows, columns = TABLES[name]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([header for header, _ in columns])
    for row in rows():
        writer.writerow(["" if (v := read(row)) is None else v for _, read in columns])
    return out.getvalue()


def acceptance_by_model(rows: list[ModelAcceptance]) -> list[dict[str, Any]]:
    """One entry per model version, oldest first: its totals and its per-action-type rows."""
    models: dict[int, dict[str, Any]] = {}
    for row in rows:
        entry = models.setdefault(row.model_version_id, {"name": row.model_name, "total": None, "types": []})
        if row.action_type:
            entry["types"].append(row)
        else:
            entry["total"] = row
    return [m for m in models.values() if m["total"] is not None]


def plots(models: list[dict[str, Any]]) -> dict[str, Any]:
    """The plots' data, uPlot-shaped (columns): daily totals over PLOT_DAYS, and acceptance per model version."""
    since = timezone.now().date() - timedelta(days=PLOT_DAYS)
    days = Throughput.objects.filter(annotator__isnull=True, day__gte=since).order_by("day")
    throughput = {"x": [], "trajectories": [], "steps": []}
    for row in days:
        throughput["x"].append(int(datetime.combine(row.day, time(), tzinfo=UTC).timestamp()))
        throughput["trajectories"].append(row.trajectories)
        throughput["steps"].append(row.steps)
    acceptance = {"models": [], "accepted": [], "edited": [], "overridden": []}
    for model in models:
        total = model["total"]
        acceptance["models"].append(model["name"])
        acceptance["accepted"].append(_pct(total.acceptance_rate))
        acceptance["edited"].append(_pct(total.edited_rate))
        acceptance["overridden"].append(_pct(total.overridden_rate))
    return {"throughput": throughput, "acceptance": acceptance}


def coverage_by_dimension(rows: list[Coverage]) -> list[tuple[str, list[Coverage]]]:
    """Coverage rows grouped under their dimension's label, in the Dimension order."""
    grouped = {d: [] for d in Coverage.Dimension.values}
    for row in rows:
        grouped.setdefault(row.dimension, []).append(row)
    labels = dict(Coverage.Dimension.choices)
    return [(labels.get(d, d), grouped[d]) for d in grouped]


class Figures:
    """The dashboard's figures, read on first use: the page renders them inside a fragment cached per refresh, so a
    load that finds the fragment cached reads none of them."""

    @cached_property
    def annotators(self) -> list[AnnotatorStats]:
        return annotator_rows()

    @cached_property
    def models(self) -> list[dict[str, Any]]:
        return acceptance_by_model(acceptance_rows())

    @cached_property
    def coverage(self) -> list[tuple[str, list[Coverage]]]:
        return coverage_by_dimension(coverage_rows())

    @cached_property
    def plots(self) -> dict[str, Any]:
        return plots(self.models)


def context() -> dict[str, Any]:
    """Everything the dashboard page shows: the latest refresh (its "as of" and backlog) and its figures."""
    return {"refresh": aggregates.latest(), "figures": Figures(), "plot_days": PLOT_DAYS, "cache_s": CACHE_S}
