"""The demo data's tasks run in the sandbox as it is: each one's setup shows its app, and its evaluator scores 0 before
a correct solution and 1 after it (the infeasible one only for fail())."""

import pytest

from annotation_app.management.commands.seed_demo import DEMO_TASKS
from sandbox.leases import LeaseStore
from sandbox.manager import SessionManager
from sandbox.osworld import evaluate, run_setup
from sandbox.sdk import run_shell

from .test_osworld import needs_sessions

SOLUTIONS = {  # what an annotator's actions leave behind, as one shell command
    "demo2-date": "date > ~/date.txt",
    "demo2-notes": "printf 'hello world' > ~/notes.txt",
    "demo2-todo": "echo 'buy milk' >> ~/todo.txt",
    "demo2-reports": "cd ~ && mkdir reports && mv *.csv reports/",
    "demo2-lines": "wc -l < /etc/passwd > ~/lines.txt",
    "demo2-script": "printf '#!/bin/sh\\necho hi\\n' > ~/hello.sh && chmod +x ~/hello.sh",
}
TASKS = {external_id: (setup, evaluator) for external_id, _d, _l, _i, setup, evaluator in DEMO_TASKS}


@pytest.fixture
def manager(tmp_path, client, namespace):
    manager = SessionManager(LeaseStore(client, capacity=1, namespace=namespace), tmp_path / "s", isolate=True)
    yield manager
    manager.shutdown()


def test_every_demo_task_with_an_evaluator_has_a_solution_here():
    scored = {key for key, (_, evaluator) in TASKS.items() if evaluator and evaluator.get("func") != "infeasible"}
    assert scored == set(SOLUTIONS)


@needs_sessions
@pytest.mark.parametrize("external_id", sorted(SOLUTIONS))
def test_a_demo_task_scores_0_before_and_1_after_its_solution(manager, external_id):
    setup, evaluator = TASKS[external_id]
    session = manager.allocate("demo", ttl_s=60)
    run_setup(session, setup)  # launches wait for their window: this fails if the app is missing
    assert session.desktop.windows(), "the task's app shows no window"
    assert evaluate(session, evaluator, last_action="finished") == 0.0
    result = run_shell(session.user, SOLUTIONS[external_id])
    assert result.exit_code == 0, result.stderr
    assert evaluate(session, evaluator, last_action="finished") == 1.0


@needs_sessions
def test_the_infeasible_demo_task_scores_1_only_for_fail(manager):
    setup, evaluator = TASKS["demo2-spreadsheet"]
    session = manager.allocate("demo", ttl_s=60)
    run_setup(session, setup)
    assert evaluate(session, evaluator, last_action="fail") == 1.0
    assert evaluate(session, evaluator, last_action="finished") == 0.0
