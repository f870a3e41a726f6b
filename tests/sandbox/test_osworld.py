"""OSWorld-format setup and evaluation on a real isolated session."""

import re

import pytest

from sandbox.desktop import available
from sandbox.isolation import isolation_available
from sandbox.leases import LeaseStore
from sandbox.manager import SessionManager
from sandbox.osworld import TaskConfigError, evaluate, run_setup
from sandbox.sdk import run_shell

from ..waiting import wait_for

pytestmark = pytest.mark.skipif(
    not (available() and isolation_available()), reason="needs root, X (Xvfb, openbox, x11vnc) and bubblewrap"
)


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


def test_setup_then_evaluate(session, tmp_path):
    local = tmp_path / "sales.csv"
    local.write_text("month,total\njan,10\nfeb,12\n")
    done = run_setup(
        session,
        [
            {"type": "execute", "parameters": {"command": ["mkdir", "-p", "inbox"]}},
            {"type": "upload_file", "parameters": {"files": [{"local_path": str(local), "path": "inbox/sales.csv"}]}},
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
