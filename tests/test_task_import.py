"""Task import: our format, OSWorld task files, JSON Lines; bad records are named and nothing is stored."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from annotation_app.models import Task
from annotation_app.task_import import TaskImportError, import_tasks

from .factories import TaskFactory

# An OSWorld task (desktop_env format) whose setup types, getters and metric the sandbox runs: it imports as it is.
# (Chrome tasks whose getters the sandbox lacks, such as default_search_engine, are refused: test_task_import_types.)
OSWORLD_TASK = {
    "id": "94d95f96-9699-4208-98ba-3c3119edf9c2",
    "snapshot": "os",
    "instruction": "I want to install Spotify on my current system. Could you please help me?",
    "source": "https://help.ubuntu.com/lts/ubuntu-help/addremove-install.html.en",
    "config": [
        {
            "type": "execute",
            "parameters": {"command": ["python", "-c", "import pyautogui; import time; pyautogui.click(960, 540)"]},
        }
    ],
    "trajectory": "trajectories/",
    "related_apps": ["os"],
    "evaluator": {
        "func": "check_include_exclude",
        "result": {"type": "vm_command_line", "command": "which spotify"},
        "expected": {"type": "rule", "rules": {"include": ["spotify"], "exclude": ["not found"]}},
    },
    "proxy": False,
}


def _import(records, filename="tasks.json", **kwargs):
    return import_tasks(json.dumps(records).encode(), filename, **kwargs)


def test_osworld_task_file_imports_as_is(db):
    result = _import(OSWORLD_TASK)
    task = Task.objects.get(pk=result.task_ids[0])
    assert task.external_id == OSWORLD_TASK["id"]
    assert task.domain == "os"
    assert task.setup_config == OSWORLD_TASK["config"]
    assert task.evaluator["func"] == "check_include_exclude"
    assert task.metadata["osworld"]["source"] == OSWORLD_TASK["source"]


def test_jsonl_with_parents_defined_later_in_the_file(db):
    lines = [
        {"id": "child", "instruction": "Second step", "parent": "root"},
        {"id": "root", "instruction": "First step", "difficulty": 2, "importance": 5},
    ]
    data = "\n".join(json.dumps(r) for r in lines).encode()
    result = import_tasks(data, "graph.jsonl")
    assert result.created == 2
    child = Task.objects.get(external_id="child")
    assert child.parent.external_id == "root"


def test_every_bad_record_is_reported_and_nothing_is_stored(db):
    TaskFactory(external_id="taken")
    records = [
        {"instruction": "fine"},
        {"instruction": ""},
        {"instruction": "x", "difficulty": 9},
        {"instruction": "x", "colour": "red"},
        {"instruction": "x", "config": [{"parameters": {}}]},
        {"instruction": "x", "evaluator": {"result": {}}},
        {"id": "taken", "instruction": "x"},
        {"instruction": "x", "parent": "nowhere"},
        "not an object",
    ]
    with pytest.raises(TaskImportError) as caught:
        _import(records)
    problems = {(e.record, e.field) for e in caught.value.errors}
    assert problems >= {
        (2, "instruction"),
        (3, "difficulty"),
        (4, "colour"),
        (5, "config[0]"),
        (6, "evaluator.func"),
        (7, "id"),
        (8, "parent"),
        (9, ""),
    }
    assert "unknown field(s): colour" in str(caught.value)
    assert Task.objects.count() == 1


def test_duplicate_ids_and_parent_cycles_are_refused(db):
    with pytest.raises(TaskImportError, match="duplicate id 'a'"):
        _import([{"id": "a", "instruction": "x"}, {"id": "a", "instruction": "y"}])
    with pytest.raises(TaskImportError, match="loops back"):
        _import([{"id": "a", "instruction": "x", "parent": "b"}, {"id": "b", "instruction": "y", "parent": "a"}])
    assert Task.objects.count() == 0


def test_skip_existing_leaves_stored_tasks_untouched(db):
    original = TaskFactory(external_id="t1", instruction="original")
    result = _import([{"id": "t1", "instruction": "changed"}, {"id": "t2", "instruction": "new"}], on_conflict="skip")
    assert (result.created, result.skipped) == (1, 1)
    original.refresh_from_db()
    assert original.instruction == "original"


@pytest.mark.parametrize(
    ("data", "filename", "message"),
    [
        (b"", "t.json", "file is empty"),
        (b"\xff\xfe\x00garbage", "t.json", "not UTF-8"),
        (b'{"instruction": ', "t.json", "invalid JSON at line 1"),
        (b'{"instruction": "ok"}\n{broken\n', "t.jsonl", "record 2: invalid JSON"),
    ],
)
def test_malformed_files_get_a_clear_error(db, data, filename, message):
    with pytest.raises(TaskImportError, match=message):
        import_tasks(data, filename)


def test_api_import_reports_errors_with_400_and_keeps_the_pool(lead_api):
    TaskFactory()
    bad = SimpleUploadedFile("t.jsonl", b'{"instruction": "ok"}\n{"instruction": 3}\n', "application/json")
    response = lead_api.post(reverse("task-import-file"), {"file": bad}, format="multipart")
    assert response.status_code == 400
    body = response.json()
    assert "nothing was stored" in body["detail"]
    assert body["errors"] == [
        {"record": 2, "field": "instruction", "message": "is required and must be a non-empty string"}
    ]
    assert Task.objects.count() == 1
    good = SimpleUploadedFile("t.json", json.dumps([OSWORLD_TASK]).encode(), "application/json")
    response = lead_api.post(reverse("task-import-file"), {"file": good}, format="multipart")
    assert response.status_code == 201 and response.json() == {"created": 1, "skipped": 0}


def test_api_import_refuses_oversized_files(lead_api, settings):
    settings.MAX_TASK_IMPORT_BYTES = 100
    big = SimpleUploadedFile("t.json", json.dumps([{"instruction": "x" * 200}]).encode())
    response = lead_api.post(reverse("task-import-file"), {"file": big}, format="multipart")
    assert response.status_code == 413
    assert "limit is 100 bytes" in response.json()["detail"]


def test_import_page_shows_the_errors(client, lead):
    client.force_login(lead)
    bad = SimpleUploadedFile("t.json", b'[{"instruction": "x", "platform": "fridge"}]')
    response = client.post(reverse("lead-import"), {"file": bad}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "platform must be one of" not in response.content.decode()  # field and message are separate cells
    assert "fridge" in response.content.decode() and "Nothing was imported" in response.content.decode()
    ok = SimpleUploadedFile("t.json", b'[{"instruction": "x"}]')
    response = client.post(reverse("lead-import"), {"file": ok}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Imported 1 task" in response.content.decode()


def test_import_page_refuses_oversized_files(client, lead, settings):
    settings.MAX_TASK_IMPORT_BYTES = 10
    client.force_login(lead)
    big = SimpleUploadedFile("t.json", b'[{"instruction": "x"}]')
    response = client.post(reverse("lead-import"), {"file": big}, HTTP_HX_REQUEST="true")
    assert response.status_code == 413 and "the limit is 10 bytes" in response.content.decode()
    assert Task.objects.count() == 0
