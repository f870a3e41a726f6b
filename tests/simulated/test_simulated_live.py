"""Simulated annotators through the real stack: gunicorn and daphne, a Celery worker on `live`, the sandbox service
with Chromium, and the tiny model behind the policy server. They open suite tasks over HTTP, accept or override the
model's proposals from the oracle's view and finish; the verifier scores what they did."""

from __future__ import annotations

import json

import pytest

from annotation_app import simulated
from annotation_app.models import Step, Task, Trajectory
from annotation_app.task_import import import_tasks
from sandbox.suite import make_task, task_id

from ..live.conftest import needs_desktop

pytestmark = [needs_desktop, pytest.mark.slow, pytest.mark.timeout(900)]  # servers start slowly on a loaded machine

CLEAN = [("click-button", 1, 1), ("dropdown", 1, 1)]  # one step and a multi-step family, played without mistakes
MISTAKEN = ("click-button", 2, 1)  # its first step is a wrong click (a distractor), which the oracle then repairs
RATE = 0.3


def suite_rows(specs: list[tuple[str, int, int]]) -> list[Task]:
    """Training instances of the suite, imported through the platform's importer."""
    data = "".join(json.dumps(make_task(name, seed, "train", level)) + "\n" for name, seed, level in specs)
    import_tasks(data.encode(), "suite.jsonl")
    return [Task.objects.get(external_id=task_id(name, seed, level)) for name, seed, level in specs]


def run_seed(clean: list[Task], mistaken: Task) -> int:
    """A seed under which the clean tasks draw no mistake and the other one draws one at its first step only."""
    draw = simulated.mistake_draw
    for seed in range(10_000):
        if all(draw(seed, t, i) >= RATE for t in clean for i in range(6)) and draw(seed, mistaken, 0) < RATE <= min(
            draw(seed, mistaken, i) for i in range(1, 6)
        ):
            return seed
    raise AssertionError("no such seed")


def test_simulated_annotators_finish_suite_tasks_through_the_live_api(live_web, embedded_model):
    *clean, mistaken = tasks = suite_rows([*CLEAN, MISTAKEN])
    annotators = simulated.simulated_annotators(2)
    reported: list[dict] = []
    results = simulated.annotate_tasks(
        live_web, tasks, annotators, seed=run_seed(clean, mistaken), mistake_rate=RATE, progress=reported.append
    )
    assert [r["task"] for r in results] == [t.pk for t in tasks] and len(reported) == 3
    assert {r["annotator"] for r in results} == {"sim-annotator-1", "sim-annotator-2"}  # both worked, in parallel
    for result, task in zip(results, tasks, strict=True):
        assert result["error"] == "", result
        assert (result["outcome"], result["end_reason"]) == (1.0, "finished"), result  # the verifier scored it 1
        trajectory = Trajectory.objects.select_related("annotator").get(pk=result["trajectory"])
        assert trajectory.simulated and trajectory.annotator.is_simulated and trajectory.task_id == task.pk
        assert trajectory.annotator.username == result["annotator"] and trajectory.mode == Trajectory.Mode.INTERACTIVE
        assert trajectory.status == Trajectory.Status.SUBMITTED and trajectory.outcome_reward == 1.0
        steps = list(trajectory.steps.order_by("index"))
        assert len(steps) == result["steps"] and all(s.status == Step.Status.DONE for s in steps)
        assert steps[-1].action["actions"][-1]["type"] == "finished"
        # every step is an accepted proposal, run as shown, or the annotator's own action
        accepted = [s for s in steps if s.chosen_candidate is not None]
        for step in accepted:
            assert step.source == Step.Source.MODEL
            assert step.action_text == step.candidates[step.chosen_candidate]["action_text"]
        assert all(s.source == Step.Source.HUMAN for s in steps if s.chosen_candidate is None)
        assert result["accepted"] == len(accepted)
        assert result["overridden"] == sum(1 for s in steps if s.chosen_candidate is None and s.candidates)
        assert result["no_proposals"] == sum(1 for s in steps if not s.candidates)
    assert [r["mistakes"] for r in results] == [0, 0, 1]
    assert [r["steps"] for r in results] == [2, 3, 3]  # click+finish, open+pick+finish, wrong+right click+finish
    wrong, right, _ = Trajectory.objects.get(pk=results[2]["trajectory"]).steps.order_by("index")
    assert wrong.source == Step.Source.HUMAN and wrong.action["actions"][0]["type"] == "click"
    assert wrong.action["actions"][0]["point"] != right.action["actions"][0]["point"]  # another button
    figures = simulated.acceptance([r["trajectory"] for r in results])
    print("simulated annotation:", results, figures)  # shown with -rP: the figures of this run
    assert figures["accepted"] == sum(r["accepted"] for r in results)
    assert figures["overridden"] == sum(r["overridden"] for r in results)
    assert figures["steps"] == 8 and figures["total"] == figures["accepted"] + figures["overridden"]
