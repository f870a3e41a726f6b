"""Template filters and tags of the flywheel pages: stage entries and evaluations made safe to show whatever keys the
stages wrote (a stage still running, an old row, a trainer that logs other metrics)."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()

TRAINING_STAGES = ("ct", "sft", "value", "ppo")


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    """`mapping[key]`, or None (templates cannot index a dict by a variable)."""
    return mapping.get(key) if isinstance(mapping, dict) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@register.filter
def in_run_order(stages: Any) -> list[tuple[str, Any]]:
    """An iteration's stage entries as (name, entry) in the order the stages run (Stage), not the stored order:
    PostgreSQL's jsonb keeps object keys sorted by length, which listed "validate" after "evaluate"."""
    from flywheel.models import Stage

    order = {stage.value: n for n, stage in enumerate(Stage)}
    items = list(stages.items()) if isinstance(stages, dict) else []
    return sorted(items, key=lambda item: order.get(item[0], len(order)))


@register.filter
def earlier_files(version: Any) -> int:
    """How many of a store version's manifest files belong to its earlier versions (listed by reference)."""
    return sum(1 for f in version.manifest.get("files", []) if f.get("version") != version.number)


@register.filter
def percent(value: Any) -> str:
    """0.4 → '40.0%'; anything else '—'."""
    number = _number(value)
    return "—" if number is None else f"{number:.1%}"


@register.filter
def num(value: Any) -> str:
    """A metric for a table cell: 4 significant digits, '—' when missing."""
    number = _number(value)
    return "—" if number is None else f"{number:.4g}"


@register.simple_tag
def training_stages(iteration: Any) -> list[dict[str, Any]]:
    """The iteration's training stages (CT, SFT, value, PPO) as the page shows them: step N of M, the last loss and
    reward, the log tail, the command and run directory."""
    rows = []
    for name, entry in in_run_order(getattr(iteration, "stages", None)):
        if name not in TRAINING_STAGES:
            continue
        entry = entry if isinstance(entry, dict) else {}
        metrics = [m for m in entry.get("metrics") or [] if isinstance(m, dict)]
        last = metrics[-1] if metrics else {}
        command = entry.get("command")
        rows.append(
            {
                "name": name,
                "status": entry.get("status", ""),
                "step": last.get("step", entry.get("done")),
                "total": last.get("total_steps", entry.get("total")),
                "loss": _number(last.get("loss")),
                "reward": _number(last.get("reward")),
                "points": len(metrics),
                "log_tail": [str(line) for line in entry.get("log_tail") or []],
                "log_text": "\n".join(str(line).rstrip("\n") for line in entry.get("log_tail") or []),
                "command": " ".join(map(str, command)) if isinstance(command, list) else str(command or ""),
                "run_dir": str(entry.get("run_dir") or ""),
                "model_id": output.get("model_id") if isinstance(output := entry.get("output"), dict) else None,
            }
        )
    return rows


def _cell(result: dict[str, Any], key: str) -> str:
    if key == "success_rate":
        return percent(result.get("success_rate"))
    if key == "ci":
        low, high = _number(result.get("ci_low")), _number(result.get("ci_high"))
        return "—" if low is None or high is None else f"{low:.1%} – {high:.1%}"
    if key == "successes":
        successes, episodes = result.get("successes"), result.get("episodes")
        return "—" if episodes is None else f"{successes if successes is not None else '—'} / {episodes}"
    return num(result.get(key))


def _task_cell(value: Any) -> str:
    if isinstance(value, dict):
        rate = percent(value.get("success_rate"))
        if value.get("episodes") is not None:
            rate += f" ({value.get('successes', '—')} / {value['episodes']})"
        return rate
    return percent(value)


@register.simple_tag
def evaluation_table(evaluation: Any) -> dict[str, Any]:
    """{"rows": [(label, new, parent)], "tasks": [(task, new, parent)], "has_parent"} from an evaluation
    {"new": {...}, "parent": {...} | None} (the EVALUATE stage's output or a model's recorded evaluation)."""
    evaluation = evaluation if isinstance(evaluation, dict) else {}
    new = evaluation.get("new") if isinstance(evaluation.get("new"), dict) else {}
    parent = evaluation.get("parent") if isinstance(evaluation.get("parent"), dict) else {}
    labels = [
        ("success_rate", "Held-out success rate"),
        ("ci", "95% confidence interval"),
        ("successes", "Successes / episodes"),
        ("mean_return", "Mean return"),
    ]
    rows = [(label, _cell(new, key), _cell(parent, key)) for key, label in labels]
    new_tasks = new.get("by_task") if isinstance(new.get("by_task"), dict) else {}
    parent_tasks = parent.get("by_task") if isinstance(parent.get("by_task"), dict) else {}
    tasks = [
        (str(task), _task_cell(new_tasks.get(task)), _task_cell(parent_tasks.get(task)))
        for task in sorted({*new_tasks, *parent_tasks}, key=str)
    ]
    return {"rows": rows, "tasks": tasks, "has_new": bool(new), "has_parent": bool(parent)}


@register.filter
def scalar_metrics(metrics: Any) -> list[tuple[str, Any]]:
    """A model's metrics that fit a table cell (numbers and short strings), by name."""
    if not isinstance(metrics, dict):
        return []
    out = []
    for key in sorted(metrics, key=str):
        value = metrics[key]
        if _number(value) is not None:
            out.append((str(key), num(value)))
        elif isinstance(value, str) and len(value) <= 80:
            out.append((str(key), value))
    return out
