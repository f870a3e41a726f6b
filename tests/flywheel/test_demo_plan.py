"""The demonstration's plan and its refusals: unknown families and iteration counts are refused with a message, and
the command refuses to start, naming each missing service, when the stack is not up (no server, no worker); an
iteration it stops following is cancelled."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from flywheel import demo
from flywheel.demo import (
    DEFAULT_PLAN,
    DemoError,
    check_stack,
    follow,
    make_plan,
    plan_from_options,
    rotate,
)
from flywheel.demo_families import DEFAULT_AGENT_FAMILIES, FULL_FAMILIES
from flywheel.iterations import start_iteration
from flywheel.models import Iteration, Stage

from ..servers import free_port


def test_plans():
    quick, full = make_plan(quick=True), make_plan()
    assert len(quick.families) == 2 and len(full.families) > len(quick.families)
    assert (quick.iterations, full.iterations, make_plan(quick=True, iterations=3).iterations) == (2, 3, 3)
    assert quick.domains == [f"suite-{name}" for name in quick.families]
    assert make_plan(seed=4, families=["slider"], iterations=1).families == ("slider",)
    with pytest.raises(DemoError, match="unknown family: telepathy"):
        make_plan(families=["telepathy"])
    with pytest.raises(DemoError, match="iterations must be from 0 to 10"):
        make_plan(iterations=11)
    assert [t for t in rotate([1, 2, 3], 2, 2)] == [3, 1] and rotate([], 2, 0) == []
    drilled = plan_from_options({**DEFAULT_PLAN, "seed": 0, "drills": 64})
    assert (quick.drills, full.drills, make_plan(drills=0).drills, drilled.drills) == (0, 32_000, 0, 64)
    assert plan_from_options({"quick": False, "seed": 0, "drills": None}).drills == 32_000
    for drills in (-1, 31, 10**6):
        with pytest.raises(DemoError, match=r"drills must be 0 \(none\) or from 32 to 200000"):
            make_plan(drills=drills)


def test_the_default_agent_learns_every_browser_family_of_the_full_plan_in_one_short_iteration():
    plan = plan_from_options({**DEFAULT_PLAN, "seed": 0})
    quick = make_plan(quick=True)
    assert plan.families == DEFAULT_AGENT_FAMILIES == FULL_FAMILIES and plan.iterations == 1
    assert plan.drills == make_plan().drills > 0  # it grounds: the full plan's drilled base
    assert (plan.train_per_family, plan.heldout_per_family, plan.max_steps) == (
        quick.train_per_family, quick.heldout_per_family, quick.max_steps)  # fmt: skip
    chosen = plan_from_options({"quick": False, "seed": 2, "families": " radio, search ,"})
    assert chosen.families == ("radio", "search") and chosen.iterations == 3


def test_the_bootstrap_takes_a_few_tasks_per_family_and_the_iterations_the_rest():
    from types import SimpleNamespace

    from flywheel.demo import interleave, split_training

    tasks = [SimpleNamespace(pk=n, metadata={"suite": family}) for n, family in enumerate("aaaabbbbcc")]
    assert [t.pk for t in interleave(tasks)] == [0, 4, 8, 1, 5, 9, 2, 6, 3, 7]
    bootstrap, fresh = split_training(make_plan(families=["click-button"], bootstrap_per_family=2), tasks)
    assert [t.pk for t in bootstrap] == [0, 4, 8, 1, 5, 9] and [t.pk for t in fresh] == [2, 6, 3, 7]
    pairs = [("a", 1), ("a", 1), ("a", 2), ("a", 2), ("b", 1), ("b", 2)]
    levels = [SimpleNamespace(pk=n, metadata={"suite": f, "difficulty": d}) for n, (f, d) in enumerate(pairs)]
    assert [t.pk for t in interleave(levels)] == [0, 4, 2, 5, 1, 3]  # by family, each family's by level
    everything, again = split_training(make_plan(families=["click-button"], bootstrap_per_family=None), tasks)
    assert len(everything) == 10 and len(again) == 10  # nothing left over: the iterations go through them again


def test_every_iteration_annotates_and_samples_the_same_number_of_instances_of_each_family():
    from collections import Counter
    from types import SimpleNamespace

    from flywheel.demo import iteration_tasks, split_training

    for plan in (make_plan(), make_plan(quick=True), make_plan(families=["radio", "search", "dropdown"])):
        families = len(plan.families)
        assert (plan.annotate_per_iteration % families, plan.rft_tasks_per_iteration % families) == (0, 0)
        tasks = [SimpleNamespace(pk=n, metadata={"suite": name}) for name in plan.families
                 for n in range(plan.train_per_family)]  # fmt: skip
        fresh = split_training(plan, tasks)[1]
        for number in range(1, plan.iterations + 1):
            for chosen in iteration_tasks(plan, fresh, number):
                counts = Counter(t.metadata["suite"] for t in chosen)
                assert set(counts) == set(plan.families) and len(set(counts.values())) == 1, (plan.families, counts)
    assert (make_plan().annotate_per_iteration, make_plan().rft_tasks_per_iteration) == (48, 30)


def test_the_full_plan_is_level_2_with_cooler_rft_and_bigger_iterations_that_never_repeat_an_instance():
    """The full plan's defaults (the run that met every goal at seed 0): level 2, RFT at temperature 0.5, 8
    instances of each family annotated and 5 sampled by RFT per iteration. --annotate and --rft-tasks set those per
    family; the plan grows its training instances so that no iteration takes one again, and keeps its first ones
    (the bootstrap and iteration 0 do not change)."""
    from types import SimpleNamespace

    from flywheel.demo import iteration_tasks, split_training

    base = {"quick": False, "seed": 1}
    bigger = demo.plan_from_options(base)
    assert bigger == demo.plan_from_options({**base, "levels": "2", "rft_temperature": 0.5, "annotate": 8,
                                             "rft_tasks": 5})  # fmt: skip
    assert (bigger.annotate_per_iteration, bigger.rft_tasks_per_iteration, bigger.rft) == (48, 30, {"temperature": 0.5})
    assert bigger.train_per_family == 2 + 3 * (8 + 5)
    assert (bigger.bootstrap_per_family, bigger.heldout_per_family, bigger.levels) == (2, 16, (2,))
    usual = replace(bigger, train_per_family=24)  # the former default's instances: the first of the same seeds
    tasks = [SimpleNamespace(pk=(name, n), metadata={"suite": name}) for name in bigger.families
             for n in range(bigger.train_per_family)]  # fmt: skip
    bootstrap, fresh = split_training(bigger, tasks)
    assert bootstrap == split_training(usual, [t for t in tasks if t.pk[1] < usual.train_per_family])[0]
    taken = [t.pk for number in (1, 2, 3) for chosen in iteration_tasks(bigger, fresh, number) for t in chosen]
    assert len(taken) == 3 * (48 + 30) == len(set(taken))  # every instance once
    mixed = demo.plan_from_options({**base, "levels": "1,2"})
    assert mixed.train_per_family == 21 and mixed.heldout_per_family == 8  # per level: 42 and 16 of each family
    smaller = demo.plan_from_options({**base, "annotate": 2, "rft_tasks": 1})
    assert (smaller.annotate_per_iteration, smaller.train_per_family) == (12, 41)  # never fewer than the plan's
    quick = make_plan(quick=True)
    assert (quick.levels, quick.rft, quick.annotate_per_iteration) == ((1,), {}, 4)  # --quick stays as it was
    with pytest.raises(CommandError, match="--annotate takes 0 to 20 instances per family, got 21"):
        call_command("flywheel", "demo", "--annotate", "21")
    with pytest.raises(CommandError, match="--rft-tasks takes 0 to 20 instances per family, got -1"):
        call_command("flywheel", "demo", "--rft-tasks", "-1")


def test_the_command_names_what_is_not_running(settings, db):
    closed = free_port()
    settings.SANDBOX_URL = f"http://127.0.0.1:{closed}"
    settings.EMBEDDED_POLICY_URL = f"http://127.0.0.1:{closed}/v1"
    problems = " ".join(check_stack(f"http://127.0.0.1:{closed}"))
    for what in ("the web app", "the sandbox service", "the policy server", "flywheel, train, sandbox, live"):
        assert what in problems
    with pytest.raises(CommandError, match="the demonstration needs the stack up"):
        call_command("flywheel", "demo", "--quick", "--base-url", f"http://127.0.0.1:{closed}")
    with pytest.raises(CommandError, match="unknown family"):
        call_command("flywheel", "demo", "--families", "nope")
    with pytest.raises(CommandError, match="drills must be"):
        call_command("flywheel", "demo", "--drills", "5")
    with pytest.raises(CommandError, match="the bootstrap must be at least 1"):
        call_command("flywheel", "demo", "--bootstrap", "0")
    assert demo.plan_from_options({"quick": False, "seed": 0, "bootstrap": 1}).bootstrap_per_family == 1
    assert demo.plan_from_options({"quick": False, "seed": 0}).bootstrap_per_family == 2
    mixed = demo.plan_from_options({"quick": False, "seed": 0, "levels": "2,1"})
    # the same held-out total (8 of each level), and training instances enough for every iteration at either level
    assert (mixed.levels, mixed.train_per_family, mixed.heldout_per_family) == ((1, 2), 21, 8)
    with pytest.raises(CommandError, match="levels 1,3 are not all had by every family"):
        call_command("flywheel", "demo", "--levels", "1,3")
    with pytest.raises(CommandError, match="--levels takes comma-separated numbers"):
        call_command("flywheel", "demo", "--levels", "one")
    warmer = demo.plan_from_options({"quick": False, "seed": 0, "rft_temperature": 1.0})
    assert warmer.rft["temperature"] == 1.0 and demo.plan_from_options({"quick": False, "seed": 0}).rft == {
        "temperature": 0.5}  # fmt: skip
    assert "temperature" not in demo.plan_from_options({"quick": True, "seed": 0}).rft  # rft.py's default: 1
    with pytest.raises(
        CommandError, match=r"--rft-temperature 3: rft.temperature must be a number from 0 to 2, got 3\.0"
    ):
        call_command("flywheel", "demo", "--rft-temperature", "3")


def test_the_default_agent_waits_for_the_policy_server_and_says_when_it_never_answers(settings, db, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    cached = tmp_path / "suite-agent"
    cached.mkdir()
    (cached / "config.json").write_text("{}")  # cached: no training, only serving it
    monkeypatch.setattr(demo, "default_dir", lambda: cached)
    settings.EMBEDDED_POLICY_URL = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"the policy server at http://127\.0\.0\.1:\d+/health does not answer"):
        call_command("flywheel", "default-agent", "--wait", "3")
    assert time.monotonic() - started >= 3
    answers = iter([["not yet"], ["not yet"], []])  # a server that comes up on the third look
    assert demo.waited(lambda: next(answers), 30, every_s=0.01) == []
    assert demo.waited(lambda: ["down"], 0.05, every_s=0.01) == ["down"]


def test_the_default_agent_is_the_model_the_demonstration_promoted_not_its_stale_root(db):
    from flywheel import registry
    from flywheel.models import ModelVersion

    root = ModelVersion.objects.create(name="demo-agent-s0-x", checkpoint_uri="/m/0")
    # as run_demo does, on this very object
    registry.promote(root, by=None, force=True, reason="the untrained agent starts")
    trained = ModelVersion.objects.create(name="it1-sft", checkpoint_uri="/m/1", parent=root,
                                          evaluation={"new": {"success_rate": 0.25}})  # fmt: skip
    ModelVersion.objects.create(name="it2-ppo", checkpoint_uri="/m/2", parent=trained,
                                evaluation={"new": {"success_rate": 0.5}})  # fmt: skip
    registry.promote(ModelVersion.objects.get(pk=trained.pk), by=None, force=True, reason="iteration 0 wins")
    assert root.is_active  # the run's own object still says so
    assert demo.best_model(root) == trained  # the active one, though a later model rated higher was not promoted
    ModelVersion.objects.update(is_active=False)
    assert demo.best_model(root).name == "it2-ppo"  # none active: the best evaluated


@pytest.mark.parametrize("how", ["ctrl-c", "timeout"])
def test_an_iteration_the_demonstration_stops_following_is_cancelled(db, how):
    """Ctrl-C (or the iteration's timeout) while the demonstration waits cancels the iteration, so its worker stops
    the stage's trainer instead of leaving it running after the run's stack is gone."""
    iteration = start_iteration(None, enqueue=False, stages=[Stage.VALIDATE])  # nothing runs it: stays pending
    seen = []

    def progress(stage: str, number: int, done: int | None, total: int | None) -> None:
        seen.append((stage, number))
        if how == "ctrl-c":
            raise KeyboardInterrupt

    expected = KeyboardInterrupt if how == "ctrl-c" else DemoError
    with pytest.raises(expected):
        follow(iteration, [Stage.VALIDATE], 2, progress, timeout_s=0 if how == "timeout" else 60)
    iteration.refresh_from_db()
    assert seen[0] == (Stage.VALIDATE, 2)
    assert iteration.status == Iteration.Status.CANCELLED and iteration.cancel_requested


def test_sigterm_stops_the_demonstration_as_ctrl_c_does_and_cancels_what_it_follows(db):
    """scripts/run stops its default-agent training with SIGTERM: a real signal reaches `follow` as an interrupt, the
    iteration is cancelled rather than left for a worker to requeue, and the previous handler is back afterwards."""
    iteration = start_iteration(None, enqueue=False, stages=[Stage.VALIDATE])

    def progress(stage: str, number: int, done: int | None, total: int | None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this sleep

    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), demo.sigterm_interrupts():
        follow(iteration, [Stage.VALIDATE], 1, progress, timeout_s=60)
    assert time.monotonic() - started < 4
    iteration.refresh_from_db()
    assert iteration.status == Iteration.Status.CANCELLED and iteration.cancel_requested
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_command_says_it_was_stopped_and_exits_130_on_sigterm(db, monkeypatch):
    def terminated(stdout, options):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(demo, "run_demo_command", terminated)
    with pytest.raises(CommandError, match="stopped") as caught:
        call_command("flywheel", "demo", "--quick")
    assert caught.value.returncode == 130


def test_the_progress_bar_measures_work_not_stages_so_its_eta_holds_from_the_first_stage():
    """The bar's length is the plan's expected seconds per stage: the grounding drills, one stage of 27, are about a
    tenth of the run (an ETA over stages read 2.5 hours after them for a 47-minute run); a stage's share grows with
    its own done/total, the bar never goes back, and the report fills it."""
    import io

    from flywheel.demo import BOOTSTRAP_STAGES, LOOP_STAGES
    from flywheel.demo_progress import TerminalProgress, stage_costs

    plan = demo.plan_from_options({"quick": False, "seed": 0, "levels": "2", "annotate": 8, "rft_tasks": 5})
    costs = stage_costs(plan, [str(s) for s in BOOTSTRAP_STAGES], [str(s) for s in LOOP_STAGES])
    assert len(costs) == 27 and list(costs)[:3] == ["0:drills", "0:demonstrations", "0:validate"]
    total = sum(costs.values())
    # measured on the reference machine (seed 1, these sizes): drills 309 of 2826 s, iteration 0 925 s
    assert 0.06 < costs["0:drills"] / total < 0.2
    assert 0.2 < sum(c for unit, c in costs.items() if unit.startswith("0:")) / total < 0.45
    assert costs["1:sft"] > 100 * costs["1:validate"] and costs["0:evaluate"] == 3 * costs["1:evaluate"]
    quick = demo.plan_from_options({"quick": True, "seed": 0})
    assert (
        "0:drills" not in stage_costs(quick, ["sft"], ["rft"])
        and sum(stage_costs(quick, ["sft"], ["rft"]).values()) < total / 5
    )

    out = io.StringIO()
    bar = TerminalProgress(plan, out, BOOTSTRAP_STAGES, LOOP_STAGES)
    bar("drills", 0, 16000, 32000)
    assert bar.bar.n == pytest.approx(costs["0:drills"] / 2, abs=0.2)
    bar("demonstrations", 0, 0, 12)
    assert bar.bar.n == pytest.approx(costs["0:drills"], abs=0.2)
    bar("drills", 0, 100, 32000)  # a late report never moves it back
    assert bar.bar.n == pytest.approx(costs["0:drills"], abs=0.2)
    bar("evaluate", 1, 48, 96)
    assert bar.bar.n == pytest.approx(bar.starts["1:evaluate"] + costs["1:evaluate"] / 2, abs=0.2)
    assert "stage 13/27 · iteration 1 · evaluate 48/96" in out.getvalue()
    bar("report", 3, 1, 1)
    assert bar.bar.n == pytest.approx(bar.bar.total, abs=0.2)
    bar.close()
    assert "100%" in out.getvalue()
