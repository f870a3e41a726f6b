"""Task import: OSWorld upload_file names only files of the task-files directory; infeasible tasks import."""

import json

import pytest

from annotation_app.models import Task
from annotation_app.task_import import TaskImportError, import_tasks


@pytest.fixture
def task_files(tmp_path, monkeypatch):
    root = tmp_path / "task-files"
    root.mkdir()
    monkeypatch.setenv("SANDBOX_TASK_FILES", str(root))
    return root


def _task(*local_paths: str) -> dict:
    files = [{"local_path": p, "path": f"Desktop/{n}.txt"} for n, p in enumerate(local_paths)]
    return {"instruction": "Open the file", "config": [{"type": "upload_file", "parameters": {"files": files}}]}


def test_upload_file_outside_the_task_files_directory_is_refused_naming_record_and_field(db, task_files, tmp_path):
    (tmp_path / "secret").write_text("x")
    (task_files / "link").symlink_to(tmp_path / "secret")
    records = [
        _task("report.txt"),  # inside (need not exist yet)
        _task("report.txt", "/etc/shadow"),
        _task("../secret"),
        _task("link"),
        _task(str(task_files / "sub" / "a.txt")),  # absolute but inside: fine
        _task(""),
    ]
    with pytest.raises(TaskImportError) as caught:
        import_tasks(json.dumps(records).encode(), "tasks.json")
    errors = {(e.record, e.field): e.message for e in caught.value.errors}
    assert set(errors) == {
        (2, "config[0].parameters.files[1].local_path"),
        (3, "config[0].parameters.files[0].local_path"),
        (4, "config[0].parameters.files[0].local_path"),
        (6, "config[0].parameters.files[0].local_path"),
    }, errors
    assert "is outside the task-files directory" in errors[(2, "config[0].parameters.files[1].local_path")]
    assert "contains '..'" in errors[(3, "config[0].parameters.files[0].local_path")]
    assert "leads out of" in errors[(4, "config[0].parameters.files[0].local_path")]
    assert "record 2, field 'config[0].parameters.files[1].local_path'" in str(caught.value)
    assert Task.objects.count() == 0


def test_tasks_inside_the_directory_and_infeasible_tasks_import(db, task_files):
    infeasible = {"instruction": "Install Photoshop on Linux", "evaluator": {"func": "infeasible"}}
    result = import_tasks(json.dumps([_task("report.txt"), infeasible]).encode(), "tasks.json")
    assert result.created == 2
