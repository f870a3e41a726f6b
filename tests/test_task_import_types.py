"""Task import checks setup and evaluator types against what the sandbox runs (sandbox.osworld), not at run time."""

import json

import pytest

from annotation_app.models import Task
from annotation_app.task_import import TaskImportError, import_tasks
from sandbox import osworld

# A real OSWorld Chrome task: its result getter is one the sandbox does not have.
OSWORLD_CHROME_TASK = {
    "id": "bb5e4c0d-f964-439c-97b6-bdb9747de3f4",
    "snapshot": "chrome",
    "instruction": "Can you make Bing the main search engine when I look stuff up on the internet?",
    "config": [{"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}}],
    "evaluator": {
        "func": "match_in_list",
        "result": {"type": "default_search_engine"},
        "expected": {"type": "rule", "rules": {"expected": ["Microsoft Bing", "Bing"]}},
    },
}


def _errors(record: dict) -> list[tuple[str, str]]:
    with pytest.raises(TaskImportError) as caught:
        import_tasks(json.dumps([record]).encode(), "t.json")
    assert not Task.objects.exists()
    return [(e.field, e.message) for e in caught.value.errors]


def test_an_unknown_setup_type_is_refused_at_import(db):
    record = {"instruction": "Go.", "config": [{"type": "launch", "parameters": {}}, {"type": "teleport"}]}
    [(field, message)] = _errors(record)
    assert field == "config[1].type"
    assert "unknown setup type 'teleport'" in message and "launch" in message


def test_an_unknown_metric_is_refused_at_import(db):
    record = {"instruction": "Go.", "evaluator": {"func": ["exact_match", "compare_pptx_files"]}}
    [(field, message)] = _errors(record)
    assert field == "evaluator.func" and "unknown metric 'compare_pptx_files'" in message and "exact_match" in message


def test_an_unknown_getter_is_refused_at_import(db):
    [(field, message)] = _errors(OSWORLD_CHROME_TASK)
    assert field == "evaluator.result" and "unknown getter type 'default_search_engine'" in message


def test_every_type_the_sandbox_runs_imports(db):
    """What the import accepts is read from the sandbox itself: each of its setup types, metrics and getters passes."""
    record = {
        "instruction": "Everything the sandbox supports.",
        "config": [{"type": kind, "parameters": {}} for kind in sorted(osworld.SETUP)],
        "evaluator": {
            "func": sorted(osworld.METRICS),
            "result": [{"type": kind} for kind in sorted(osworld.GETTERS)],
            "expected": [{"type": "rule", "rules": {}}],
        },
    }
    assert import_tasks(json.dumps([record]).encode(), "t.json").created == 1
