"""Task import from JSON or JSON Lines, in our own format or OSWorld's (`desktop_env` task files).

All records are validated before anything is written; the import is one transaction, so a file with one bad record
stores nothing and the error names the record (line, for JSON Lines), the field and what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from .consumers import notify_role
from .models import Role, Task, User

MAX_REPORTED_ERRORS = 50
MAX_INSTRUCTION_CHARS = 20_000
# Our fields, and OSWorld's (id, snapshot, source, config, evaluator, related_apps, ...).
TASK_FIELDS = {
    "external_id",
    "id",
    "instruction",
    "platform",
    "domain",
    "related_apps",
    "difficulty",
    "importance",
    "setup_config",
    "config",
    "evaluator",
    "metadata",
    "parent",
    "required_annotations",
    "is_gold",
}
OSWORLD_EXTRA_FIELDS = {"snapshot", "source", "trajectory", "proxy", "fixed_ip", "possibility_of_env_change"}
EVALUATOR_FIELDS = {"func", "conj", "result", "expected", "options", "postconfig"}
PLATFORMS = set(Task.Platform.values)


@dataclass
class RecordError:
    record: int  # 1-based position in the file (the line number for JSON Lines)
    field: str
    message: str

    def __str__(self) -> str:
        where = f"record {self.record}" + (f", field '{self.field}'" if self.field else "")
        return f"{where}: {self.message}"


class TaskImportError(ValueError):
    """The file can't be imported; `errors` says which records are wrong and why. Nothing was stored."""

    def __init__(self, errors: list[RecordError], total_errors: int | None = None):
        self.errors = errors[:MAX_REPORTED_ERRORS]
        self.total_errors = total_errors if total_errors is not None else len(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


@dataclass
class ImportResult:
    created: int = 0
    skipped: int = 0
    task_ids: list[int] = field(default_factory=list)


def parse_records(data: bytes, filename: str = "") -> list[tuple[int, Any]]:
    """Split a file into (position, record) pairs. JSON: an object, a list, or {"tasks": [...]}; else JSON Lines."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskImportError([RecordError(0, "", f"file is not UTF-8 text (byte {exc.start})")]) from None
    if not text.strip():
        raise TaskImportError([RecordError(0, "", "file is empty")])
    is_jsonl = filename.lower().endswith((".jsonl", ".ndjson"))
    if not is_jsonl:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            if filename.lower().endswith(".json"):
                raise TaskImportError(
                    [RecordError(0, "", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")]
                ) from None
            is_jsonl = True  # no telling extension: maybe JSON Lines
        else:
            if isinstance(document, dict) and isinstance(document.get("tasks"), list):
                # A batch may ask every task of it for k annotations: {"required_annotations": k, "tasks": [...]}.
                batch_k = document.get("required_annotations")
                document = document["tasks"]
                if batch_k is not None:
                    document = [{"required_annotations": batch_k, **r} if isinstance(r, dict) else r for r in document]
            records = document if isinstance(document, list) else [document]
            return list(enumerate(records, start=1))
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise TaskImportError([RecordError(lineno, "", f"invalid JSON at column {exc.colno}: {exc.msg}")]) from None
    return records


def _check_int(value: Any, name: str, low: int, high: int, errors: list[str]) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(f"{name}|must be an integer, got {type(value).__name__}")
        return None
    if not low <= value <= high:
        errors.append(f"{name}|must be between {low} and {high}, got {value}")
        return None
    return value


def check_setup_config(value: Any, name: str, errors: list[str]) -> list:
    """OSWorld `config`: a list of {type, parameters}. Problems are appended to `errors` as "field|message"."""
    if not isinstance(value, list):
        errors.append(f"{name}|must be a list of {{type, parameters}} objects")
        return []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str) or not item["type"]:
            errors.append(f"{name}[{i}]|must be an object with a non-empty string 'type'")
        elif not isinstance(item.get("parameters", {}), dict):
            errors.append(f"{name}[{i}].parameters|must be an object")
        elif item["type"] not in (setup_types := sandbox_supports()[0]):
            known = ", ".join(sorted(setup_types))
            errors.append(f"{name}[{i}].type|unknown setup type {item['type']!r}; the sandbox runs: {known}")
        elif item["type"] == "upload_file":
            check_upload_files(item.get("parameters", {}), f"{name}[{i}].parameters", errors)
    return value


def check_upload_files(parameters: dict, name: str, errors: list[str]) -> None:
    """OSWorld upload_file: every `local_path` lies in the sandbox's task-files directory (SANDBOX_TASK_FILES); the
    service runs as root and refuses others again at setup."""
    from sandbox.task_files import TaskFileOutside, task_file

    files = parameters.get("files")
    for j, entry in enumerate(files if isinstance(files, list) else []):  # a malformed step fails at setup
        if isinstance(entry, dict) and "local_path" in entry:
            try:
                task_file(entry["local_path"])
            except TaskFileOutside as exc:
                errors.append(f"{name}.files[{j}].local_path|{exc}")


def sandbox_supports() -> tuple[set[str], set[str], set[str]]:
    """Setup types, metrics and getter types the sandbox runs, read from sandbox.osworld (imported on first use: it
    loads the desktop and browser backends, which most web requests never need)."""
    from sandbox import osworld

    return set(osworld.SETUP), {*osworld.METRICS, osworld.INFEASIBLE}, set(osworld.GETTERS)


def check_evaluator(value: Any, errors: list[str]) -> dict:
    """OSWorld `evaluator`: {func, result, expected, ...} with known keys and metric names in `func`."""
    if not isinstance(value, dict):
        errors.append("evaluator|must be an object like {func, result, expected}")
        return {}
    if not value:
        return value
    unknown = sorted(set(value) - EVALUATOR_FIELDS)
    if unknown:
        errors.append(
            f"evaluator|unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(EVALUATOR_FIELDS))}"
        )
    func = value.get("func")
    funcs = func if isinstance(func, list) else [func]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        errors.append("evaluator.func|must be a metric name or a list of metric names")
        return value
    _, metrics, getters = sandbox_supports()
    for f in funcs:
        if f not in metrics:
            errors.append(f"evaluator.func|unknown metric {f!r}; the sandbox has: {', '.join(sorted(metrics))}")
    for key in ("result", "expected"):
        specs = value.get(key)
        for spec in specs if isinstance(specs, list) else [specs]:
            kind = spec.get("type") if isinstance(spec, dict) else None
            if spec and kind not in getters:
                errors.append(
                    f"evaluator.{key}|unknown getter type {kind!r}; the sandbox has: {', '.join(sorted(getters))}"
                )
    return value


def validate_record(record: Any) -> tuple[dict, list[tuple[str, str]]]:
    """Check one record; returns the Task field values and a list of (field, message) problems."""
    if not isinstance(record, dict):
        return {}, [("", f"must be a JSON object, got {type(record).__name__}")]
    problems: list[str] = []
    unknown = sorted(set(record) - TASK_FIELDS - OSWORLD_EXTRA_FIELDS)
    if unknown:
        problems.append(f"{unknown[0]}|unknown field(s): {', '.join(unknown)}")
    if "id" in record and "external_id" in record:
        problems.append("id|give either 'id' or 'external_id', not both")

    instruction = record.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        problems.append("instruction|is required and must be a non-empty string")
    elif len(instruction) > MAX_INSTRUCTION_CHARS:
        problems.append(f"instruction|is longer than {MAX_INSTRUCTION_CHARS} characters")

    external_id = record.get("external_id", record.get("id"))
    if external_id is not None and (not isinstance(external_id, str) or not 0 < len(external_id) <= 200):
        problems.append("id|must be a string of 1 to 200 characters")
        external_id = None

    platform = record.get("platform", Task.Platform.DESKTOP)
    if platform not in PLATFORMS:
        problems.append(f"platform|must be one of {', '.join(sorted(PLATFORMS))}, got {platform!r}")

    related_apps = record.get("related_apps", [])
    if not isinstance(related_apps, list) or not all(isinstance(a, str) for a in related_apps):
        problems.append("related_apps|must be a list of strings")
        related_apps = []
    domain = record.get("domain", record.get("snapshot") or (related_apps[0] if related_apps else ""))
    if not isinstance(domain, str) or len(domain) > 100:
        problems.append("domain|must be a string of at most 100 characters")

    difficulty = _check_int(record.get("difficulty", 3), "difficulty", 1, 5, problems)
    importance = _check_int(record.get("importance", 0), "importance", -1000, 1000, problems)
    config_name = "config" if "config" in record else "setup_config"
    setup_config = check_setup_config(record.get(config_name, []), config_name, problems)
    evaluator = check_evaluator(record.get("evaluator", {}), problems)
    metadata = record.get("metadata", {})
    if not isinstance(metadata, dict):
        problems.append("metadata|must be an object")
        metadata = {}
    parent = record.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        problems.append("parent|must be the id of another task")
    required = _check_int(record.get("required_annotations", 1), "required_annotations", 1, 20, problems)
    is_gold = record.get("is_gold", False)
    if not isinstance(is_gold, bool):
        problems.append("is_gold|must be true or false")
    elif is_gold and not evaluator:
        problems.append("is_gold|a gold task needs an evaluator: its accuracy is the verifier's outcome")

    extras = {k: record[k] for k in OSWORLD_EXTRA_FIELDS if k in record}
    values = {
        "external_id": external_id,
        "instruction": instruction.strip() if isinstance(instruction, str) else "",
        "platform": platform,
        "domain": domain if isinstance(domain, str) else "",
        "related_apps": related_apps,
        "difficulty": difficulty,
        "importance": importance,
        "setup_config": setup_config,
        "evaluator": evaluator,
        "metadata": {**metadata, **({"osworld": extras} if extras else {})},
        "parent": parent,
        "required_annotations": required,
        "is_gold": is_gold is True,
    }
    return values, [tuple(p.split("|", 1)) for p in problems]  # type: ignore[misc]


def _parent_cycles(parent_of: dict[str, str]) -> set[str]:
    """Ids in the file whose parent chain (within the file) loops back on itself."""
    in_cycle: set[str] = set()
    for start in parent_of:
        seen, node = set(), start
        while node in parent_of and node not in seen:
            seen.add(node)
            node = parent_of[node]
        if node == start:
            in_cycle.add(start)
    return in_cycle


def import_tasks(
    data: bytes,
    filename: str = "",
    *,
    created_by: User | None = None,
    on_conflict: str = "error",
    progress: Callable[[int], None] | None = None,
) -> ImportResult:
    """Validate every record of `data`, then create all tasks in one transaction.

    on_conflict: "error" (an id already in the database is an error) or "skip" (such records are left out).
    Raises TaskImportError listing the bad records; nothing is stored in that case.
    """
    if on_conflict not in {"error", "skip"}:
        raise TaskImportError([RecordError(0, "on_conflict", "must be 'error' or 'skip'")])
    records = parse_records(data, filename)
    errors: list[RecordError] = []
    rows: list[tuple[int, dict]] = []
    seen_ids: dict[str, int] = {}
    for position, record in records:
        values, problems = validate_record(record)
        errors.extend(RecordError(position, f, m) for f, m in problems)
        ext = values.get("external_id")
        if ext is not None and not problems:
            if ext in seen_ids:
                errors.append(
                    RecordError(position, "id", f"duplicate id {ext!r} (first used by record {seen_ids[ext]})")
                )
            seen_ids.setdefault(ext, position)
        rows.append((position, values))

    existing = set(_existing_ids(seen_ids))
    skipped = 0
    if existing and on_conflict == "skip":
        before = len(rows)
        rows = [(p, v) for p, v in rows if v.get("external_id") not in existing]
        skipped = before - len(rows)
    elif existing:
        errors.extend(
            RecordError(seen_ids[ext], "id", f"a task with id {ext!r} already exists") for ext in sorted(existing)
        )

    file_ids = {v["external_id"] for _, v in rows if v.get("external_id")}
    wanted_parents = {v["parent"] for _, v in rows if isinstance(v.get("parent"), str)}
    known_parents = dict(_existing_ids(wanted_parents - file_ids, with_pk=True))
    for position, values in rows:
        parent = values.get("parent")
        if isinstance(parent, str) and parent not in file_ids and parent not in known_parents:
            errors.append(RecordError(position, "parent", f"no task with id {parent!r} in this file or the database"))
    parent_of = {v["external_id"]: v["parent"] for _, v in rows if v.get("external_id") and v.get("parent")}
    for ext in sorted(_parent_cycles(parent_of)):
        errors.append(RecordError(seen_ids[ext], "parent", f"parent chain of {ext!r} loops back to itself"))

    if errors:
        errors.sort(key=lambda e: e.record)
        raise TaskImportError(errors)
    if not rows:
        return ImportResult(skipped=skipped)
    return _store(rows, known_parents, created_by, skipped, progress)


def _existing_ids(ids: Iterable[str], with_pk: bool = False) -> list:
    ids = list(ids)
    if not ids:
        return []
    qs = Task.objects.filter(external_id__in=ids)
    return list(qs.values_list("external_id", "pk")) if with_pk else list(qs.values_list("external_id", flat=True))


@transaction.atomic
def _store(
    rows: list[tuple[int, dict]],
    known_parents: dict[str, int],
    created_by: User | None,
    skipped: int,
    progress: Callable[[int], None] | None,
    batch_size: int = 2000,
) -> ImportResult:
    created: list[Task] = []
    for start in range(0, len(rows), batch_size):
        batch = [
            Task(**{k: v for k, v in values.items() if k != "parent"}, created_by=created_by)
            for _, values in rows[start : start + batch_size]
        ]
        created.extend(Task.objects.bulk_create(batch))
        if progress:
            progress(len(batch))
    pk_of = {**known_parents, **{t.external_id: t.pk for t in created if t.external_id}}
    with_parent = []
    for task, (_, values) in zip(created, rows, strict=True):
        if values.get("parent"):
            task.parent_id = pk_of[values["parent"]]
            with_parent.append(task)
    Task.objects.bulk_update(with_parent, ["parent"], batch_size=batch_size)
    transaction.on_commit(lambda: notify_role(Role.DATA_LEAD, "tasks_changed", created=len(created)))
    return ImportResult(created=len(created), skipped=skipped, task_ids=[t.pk for t in created])
