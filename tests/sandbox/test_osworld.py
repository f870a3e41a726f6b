"""OSWorld-format setup and evaluation on a real isolated session."""

import re

import pytest

from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.leases import LeaseStore
from sandbox.manager import SessionManager
from sandbox.osworld import TaskConfigError, evaluate, run_setup, score_by_last_action
from sandbox.sdk import run_shell
from sandbox.task_files import TaskFileOutside, task_file

from ..waiting import wait_for

needs_sessions = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)


@pytest.fixture
def task_files(tmp_path, monkeypatch):
    """A task-files directory of its own (SANDBOX_TASK_FILES), as the service reads it."""
    root = tmp_path / "task-files"
    root.mkdir()
    monkeypatch.setenv("SANDBOX_TASK_FILES", str(root))
    return root


@pytest.fixture
def session(tmp_path, client, namespace):
    manager = SessionManager(LeaseStore(client, capacity=1, namespace=namespace), tmp_path / "s", isolate=True)
    yield manager.allocate("evaluator", ttl_s=60)
    manager.shutdown()


TASK_EVALUATOR = {
    "func": ["check_include_exclude", "file_exists", "exact_match"],
    "result": [
        {"type": "vm_command_line", "command": ["ls", "reports"]},
        {"type": "vm_file", "path": "reports/sales.csv"},
        {"type": "vm_command_line", "command": "wc -l < reports/sales.csv", "shell": True},
    ],
    "expected": [
        {"type": "rule", "rules": {"include": ["sales.csv"], "exclude": ["draft.csv"]}},
        None,
        {"type": "rule", "rules": {"expected": "3"}},
    ],
    "conj": "and",
}


@needs_sessions
def test_setup_then_evaluate(session, task_files):
    (task_files / "sales.csv").write_text("month,total\njan,10\nfeb,12\n")
    done = run_setup(
        session,
        [
            {"type": "execute", "parameters": {"command": ["mkdir", "-p", "inbox"]}},
            {"type": "upload_file", "parameters": {"files": [{"local_path": "sales.csv", "path": "inbox/sales.csv"}]}},
            {"type": "launch", "parameters": {"command": "xterm -e sh -c 'touch launched; sleep 30'", "shell": True}},
            {"type": "sleep", "parameters": {"seconds": 0.1}},
        ],
    )
    assert done[1] == "uploaded 1 file(s)"
    assert wait_for(lambda: (session.user.home / "launched").exists())
    assert evaluate(session, TASK_EVALUATOR) == 0.0  # the agent has not done the task yet
    run_shell(session.user, "mkdir reports && mv inbox/sales.csv reports/")
    assert evaluate(session, TASK_EVALUATOR) == 1.0
    run_shell(session.user, "touch reports/draft.csv")
    assert evaluate(session, TASK_EVALUATOR) == 0.0
    assert evaluate(session, {**TASK_EVALUATOR, "conj": "or"}) == 1.0


@needs_sessions
@pytest.mark.parametrize(
    ("config", "evaluator", "message"),
    [
        ([{"type": "teleport", "parameters": {}}], None, "config[0]: unknown setup type 'teleport'"),
        ([{"type": "execute", "parameters": {}}], None, "config[0] (execute): missing parameter 'command'"),
        ([{"type": "execute", "parameters": {"command": ["false"]}}], None, "command failed (1)"),
        (None, {"func": "telepathy", "result": {"type": "rule", "rules": {}}}, "unknown metric"),
        (None, {"func": "exact_match", "result": {"type": "vm_screen"}}, "unknown getter type 'vm_screen'"),
        (None, {"func": "exact_match", "conj": "xor", "result": {"type": "rule", "rules": {}}}, "conj must be"),
    ],
)
def test_bad_task_configs_say_what_is_wrong(session, config, evaluator, message):
    with pytest.raises(TaskConfigError, match=re.escape(message)):
        if config is not None:
            run_setup(session, config)
        else:
            evaluate(session, evaluator)


@needs_sessions
def test_upload_file_copies_only_from_the_task_files_directory(session, task_files, tmp_path):
    """The service runs as root: a task must not copy /etc/shadow or the service's key into a desktop."""
    (task_files / "ok.txt").write_text("fine")
    (task_files / "docs").mkdir()
    (task_files / "docs" / "inner.txt").write_text("inner")
    (tmp_path / "secret").write_text("host secret")
    (task_files / "escape").symlink_to(tmp_path / "secret")
    (task_files / "dir-escape").symlink_to(tmp_path)
    (task_files / "inside-link").symlink_to(task_files / "ok.txt")

    def upload(*local_paths: str) -> list[str]:
        files = [{"local_path": p, "path": f"in/{n}.txt"} for n, p in enumerate(local_paths)]
        return run_setup(session, [{"type": "upload_file", "parameters": {"files": files}}])

    for bad, why in [
        ("/etc/shadow", "is outside the task-files directory"),
        (str(tmp_path / "secret"), "is outside the task-files directory"),
        ("../secret", "contains '..'"),
        ("docs/../../secret", "contains '..'"),
        ("escape", "leads out of the task-files directory"),
        ("dir-escape/secret", "leads out of the task-files directory"),
        ("", "must be a non-empty path"),
    ]:
        with pytest.raises(TaskConfigError, match=re.escape("config[0] (upload_file): files[1].local_path: ")) as e:
            upload("ok.txt", bad)  # the good first file is not copied either: every path is checked first
        assert why in str(e.value), (bad, str(e.value))
        assert not (session.user.home / "in").exists()
    assert upload("ok.txt", "docs/inner.txt", str(task_files / "inside-link")) == ["uploaded 3 file(s)"]
    got = [(session.user.home / "in" / f"{n}.txt").read_text() for n in range(3)]
    assert got == ["fine", "inner", "fine"]
    with pytest.raises(TaskConfigError, match=r"files\[0\].local_path: no task file 'missing.txt'"):
        upload("missing.txt")


def test_task_file_paths_are_resolved_inside_the_directory(task_files):
    assert task_file("a/b.txt") == task_files.resolve() / "a" / "b.txt"  # need not exist yet (import time)
    assert task_file(str(task_files / "c.txt")) == task_files.resolve() / "c.txt"
    for bad in ("/etc/passwd", "..", "a/../../b", str(task_files), ".", "x\0y"):
        with pytest.raises(TaskFileOutside):
            task_file(bad)


@pytest.mark.parametrize(
    ("func", "last_action", "score"),
    [
        ("infeasible", "fail", 1.0),
        ("infeasible", "finished", 0.0),
        ("infeasible", "call_user", 0.0),  # call_user is not FAIL
        ("infeasible", None, 0.0),
        ("exact_match", "fail", 0.0),  # giving up on a feasible task fails it, whatever the state
        ("exact_match", "finished", None),  # the state decides
        ("exact_match", "call_user", None),
    ],
)
def test_osworlds_rule_for_the_last_action(func, last_action, score):
    assert score_by_last_action({"func": func}, last_action) == score


def test_infeasible_stands_alone():
    with pytest.raises(TaskConfigError, match="'infeasible' stands alone"):
        score_by_last_action({"func": ["infeasible", "exact_match"]}, "fail")


@needs_sessions
def test_infeasible_tasks_are_scored_by_the_last_action(session):
    assert evaluate(session, {"func": "infeasible"}, last_action="fail") == 1.0
    assert evaluate(session, {"func": "infeasible"}, last_action="finished") == 0.0
    assert evaluate(session, {"func": "infeasible"}) == 0.0
    run_shell(session.user, "echo done > flag")
    flag = {
        "func": "exact_match",
        "result": {"type": "vm_file", "path": "flag"},
        "expected": {"type": "rule", "rules": {"expected": "done"}},
    }
    assert evaluate(session, flag, last_action="finished") == 1.0
    assert evaluate(session, flag, last_action="call_user") == 1.0
    assert evaluate(session, flag, last_action="fail") == 0.0


@needs_sessions
def test_launch_waits_for_the_window_so_the_first_observation_shows_the_app(session):
    run_setup(session, [{"type": "launch", "parameters": {"command": ["mousepad"]}}])
    assert any(cls == "Mousepad" for cls, _ in session.desktop.windows())  # no wait needed after setup returns


@needs_sessions
@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"command": ["libreoffice_calc"]}, r"exited with status 127: command not found: is the application installed"),
        ({"command": "sleep 30", "shell": True, "window_timeout": 1}, r"showed no window within 1 s"),
    ],
)
def test_a_launch_that_cannot_show_its_app_fails_the_setup_with_the_reason(session, parameters, message):
    with pytest.raises(TaskConfigError, match=message):
        run_setup(session, [{"type": "launch", "parameters": parameters}])


@needs_sessions
def test_a_launch_without_a_window_can_say_so(session):
    done = run_setup(session, [{"type": "launch", "parameters": {"command": "sleep 5", "shell": True,
                                                                  "wait_for_window": False}}])  # fmt: skip
    assert done == ["launched sleep 5"]
