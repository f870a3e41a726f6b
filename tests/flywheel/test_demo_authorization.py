"""The demonstration's report (`/flywheel/demo/`, its JSON and PNG) for every role, its answers to bad input, and its
figures computed from database rows: held-out success per family and overall with Wilson intervals, the SFT share of
new trajectories, the acceptance rate of proposals, per-stage counts and times."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from annotation_app.models import Step, Task, Trajectory
from flywheel.demo import summary_lines
from flywheel.demo_report import build_report, plot_png
from flywheel.models import Iteration, ModelVersion, Route, Validation
from training.evaluate import wilson_interval

from ..conftest import ROLES, api_client_for

A, L, M, S = "annotator", "data_lead", "ml_engineer", "superuser"
READERS = {L, M, S}
DEMO_MATRIX: list[tuple[str, str, str, set[str]]] = [
    ("flywheel-demo", "get", "page", READERS),
    ("flywheel-demo-json", "get", "page", READERS),
    ("flywheel-demo-png", "get", "page", READERS),
]
DEMO_ROUTES = {name for name, *_ in DEMO_MATRIX}  # tests/test_authorization.py takes these as covered


def _demo(results: tuple[tuple[int, int, bool], ...] = ((1, 1, True), (3, 2, True))) -> ModelVersion:
    """A finished demonstration as the runner leaves it in the database: per iteration (held-out wins of 4, new
    trajectories routed to SFT of 2, promoted)."""
    root = ModelVersion.objects.create(name="demo-agent-s0-x", checkpoint_uri="/m/0", notes='plan {"seed": 0}')
    tasks = {}
    for family, level in (("click-button", 1), ("radio", 2)):
        for split, seed in (("heldout", 0), ("train", 1)):
            tasks[family, split] = Task.objects.create(
                external_id=f"suite-{family}-{split}-s{seed}-d{level}", instruction=family, project="demo-suite",
                domain=f"suite-{family}", metadata={"suite": family, "seed": seed, "split": split, "difficulty": level},
            )  # fmt: skip
    base, made = root, []
    for number, (wins, sft, promoted) in enumerate(results):
        stages = ["validate", "export", "sft", "evaluate"]
        iteration = Iteration.objects.create(base_model=base, status=Iteration.Status.SUCCEEDED, selected_stages=stages)
        model = ModelVersion.objects.create(name=f"it{iteration.pk}-sft", checkpoint_uri="/m", parent=base,
                                            iteration=iteration, stage="sft")  # fmt: skip
        by_task = {
            tasks["click-button", "heldout"].external_id: {"episodes": 2, "successes": min(wins, 2)},
            tasks["radio", "heldout"].external_id: {"episodes": 2, "successes": max(wins - 2, 0)},
        }
        new = {"episodes": 4, "successes": wins, "by_task": by_task}
        output = {"model_id": model.pk, "promoted": promoted, "new": new,
                  "parent": {"episodes": 4, "successes": 0, "by_task": {}}}  # fmt: skip
        iteration.stages = {
            "validate": {"status": "done", "seconds": 1.5},
            "sft": {"status": "done", "seconds": 30.0},
            "evaluate": {"status": "done", "seconds": 20.0, "output": output},
        }  # fmt: skip
        iteration.save()
        for n in range(2):
            trajectory = Trajectory.objects.create(
                task=tasks["radio", "train"], mode=Trajectory.Mode.INTERACTIVE, simulated=True,
                status=Trajectory.Status.SUBMITTED,
            )  # fmt: skip
            chosen = 0 if n < number + 1 else None
            Step.objects.create(trajectory=trajectory, index=0, action_text="wait()",
                                candidates=[{"action_text": "wait()"}], chosen_candidate=chosen)  # fmt: skip
            route = Route.SFT if n < sft else Route.CT
            Validation.objects.create(iteration=iteration, trajectory=trajectory, v=0.9, route=route, reason="r",
                                      threshold=0.5)  # fmt: skip
        base = model
        made.append(iteration)
    return root


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method", "kind", "allowed"), DEMO_MATRIX, ids=[n for n, *_ in DEMO_MATRIX])
def test_authorization(role, name, method, kind, allowed, make_user):
    _demo()
    client = api_client_for(None)
    if role != "anonymous":
        user = make_user(role)
        client.force_login(user)
    response = client.get(reverse(name))
    code = response.status_code
    if role in allowed:
        assert code == 200, f"{role} should read {name}, got {code}"
    elif role == "anonymous":
        assert code == 302 and response["Location"].startswith(reverse("login")), code
    else:
        assert code == 403, f"{role} must not read {name}, got {code}"


def _reader(make_user):
    client = api_client_for(None)
    client.force_login(make_user("data_lead"))
    return client


def test_bad_roots_are_400_with_the_reason_and_no_run_is_said(make_user):
    client = _reader(make_user)
    assert "No demonstration has run yet" in client.get(reverse("flywheel-demo")).content.decode()
    assert client.get(reverse("flywheel-demo-json")).status_code == 404
    assert client.get(reverse("flywheel-demo-png")).status_code == 404
    root = _demo()
    page = client.get(reverse("flywheel-demo") + "?root=abc")
    assert page.status_code == 400 and "root must be a model id" in page.content.decode()
    other = ModelVersion.objects.create(name="not-a-demo", checkpoint_uri="/x")
    answer = client.get(reverse("flywheel-demo-json") + f"?root={other.pk}")
    assert answer.status_code == 400 and "not the root of a flywheel demonstration" in answer.json()["detail"]
    assert client.get(reverse("flywheel-demo-png") + "?root=-1").status_code == 400
    assert client.get(reverse("flywheel-demo-json") + f"?root={root.pk}").json()["root"] == root.name


def test_the_goals_name_the_model_the_loop_kept_when_the_last_one_was_not_promoted(db):
    root = _demo(((1, 1, True), (3, 2, True), (1, 2, False)))
    goals = build_report(root)["goals"]
    assert (goals["ratio"], goals["doubled"]) == (1.0, False)  # the last iteration's own model
    assert goals["kept"] == {"number": 1, "ratio": 3.0, "doubled": True, "intervals_apart": False}
    assert summary_lines(root)[-3:] == [  # the command's closing lines say both, then the other goals
        "last vs it 0: x1.00, doubled False, intervals apart False",
        "kept (it 1) vs it 0: x3.00, doubled True, intervals apart False",
        "SFT share rising False (within CI False), acceptance rising False (within CI False), within 60 min None",
    ]


def test_the_goals_say_whether_the_sft_share_and_the_acceptance_rose_and_the_run_kept_to_its_time(make_user):
    from flywheel.demo_report import rising

    root = _demo(((1, 2, True), (2, 0, True), (3, 1, True), (4, 2, True)))
    goals = build_report(root)["goals"]
    # iterations 1-3 routed 0, 1 and 2 of 2 to SFT; their proposals were accepted 2, 2 and 2 of 2 times
    assert (goals["sft_share_rising"], goals["acceptance_rising"]) == (True, False)
    assert (goals["sft_share_rising_within_ci"], goals["acceptance_rising_within_ci"]) == (True, False)  # flat
    assert (goals["time_limit_s"], goals["within_time"]) == (3600.0, None)  # no iteration has finished times
    start = root.created_at
    for n, iteration in enumerate(Iteration.objects.filter(base_model__isnull=False).order_by("created_at")):
        began = start + timedelta(minutes=20 * n)
        Iteration.objects.filter(pk=iteration.pk).update(started_at=began, finished_at=began + timedelta(minutes=15))
    assert build_report(root)["goals"]["within_time"] is False  # 75 minutes
    root.notes = 'plan {"seed": 0, "quick": true}'
    root.save()
    goals = build_report(root)["goals"]
    assert (goals["time_limit_s"], goals["within_time"]) == (600.0, False)
    page = _reader(make_user).get(reverse("flywheel-demo")).content.decode()
    assert (
        "SFT share rising: yes (within its intervals: yes); acceptance rising: no (within its intervals: no); "
        "within 10 minutes: no."
    ) in page
    # iteration 0 (the bootstrap) is left out; a dip anywhere, a flat line or a single measure is not a rise
    share = [{"successes": 4, "n": 4}, {"successes": 1, "n": 4}, {"successes": 2, "n": 4}]
    assert rising(share, "successes") is True
    assert rising([*share, {"successes": 1, "n": 4}, {"successes": 4, "n": 4}], "successes") is False
    assert rising([None, {"successes": 1, "n": 4}, {"successes": 0, "n": 0}], "successes") is None
    assert rising([None, {"accepted": 2, "n": 4}, {"accepted": 1, "n": 2}], "accepted") is False
    # within the intervals: a dip the later measure's 95 % interval covers is no fall; one beyond it is
    dip = [None, {"accepted": 1, "n": 4}, {"accepted": 3, "n": 4}, {"accepted": 2, "n": 4}]
    assert (rising(dip, "accepted"), rising(dip, "accepted", within_ci=True)) == (False, True)
    fall = [None, {"accepted": 1, "n": 8}, {"accepted": 8, "n": 8}, {"accepted": 3, "n": 8}]
    assert rising(fall, "accepted", within_ci=True) is False
    assert rising([None, {"accepted": 2, "n": 4}, {"accepted": 2, "n": 4}], "accepted", within_ci=True) is False


def test_the_report_is_computed_from_the_database(make_user):
    root = _demo()
    report = build_report(root)
    first, last = report["iterations"]
    assert (first["number"], last["number"]) == (0, 1) and report["plan"] == {"seed": 0}
    assert first["heldout"]["overall"]["successes"] == 1 and last["heldout"]["overall"]["successes"] == 3
    assert last["heldout"]["by_family"]["click-button"]["successes"] == 2
    assert last["heldout"]["by_family"]["radio"]["successes"] == 1
    assert {level: r["successes"] for level, r in last["heldout"]["by_level"].items()} == {"1": 2, "2": 1}
    low, high = wilson_interval(3, 4)
    assert (last["heldout"]["overall"]["ci_low"], last["heldout"]["overall"]["ci_high"]) == (low, high)
    assert report["untrained"]["overall"]["n"] == 4 and report["untrained"]["overall"]["successes"] == 0
    assert (first["sft_share"]["successes"], last["sft_share"]["successes"], last["sft_share"]["n"]) == (1, 2, 2)
    assert (first["acceptance"]["accepted"], last["acceptance"]["accepted"], last["acceptance"]["n"]) == (1, 2, 2)
    assert last["stages"]["sft"]["seconds"] == 30.0 and last["stages"]["validate"]["trajectories"] == 2
    assert last["stages"]["annotation"]["trajectories"] == 2 and last["promoted"] is True
    assert report["goals"]["doubled"] is True and report["simulated_trajectories"] == 4
    assert report["goals"]["kept"] == {"number": 1, "ratio": 3.0, "doubled": True, "intervals_apart": False}
    assert plot_png(report)[:8] == b"\x89PNG\r\n\x1a\n"
    page = _reader(make_user).get(reverse("flywheel-demo")).content.decode()
    assert "Held-out success per family" in page and "click-button" in page and "3/4" in page
    assert "drills" not in page
    assert "Held-out success per difficulty level" in page and "level 2" in page and "difficulty levels" not in page
    root.notes = 'flywheel demonstration: untrained agent; plan {"seed": 0, "drills": 32000, "levels": [1, 2]}'
    root.save()
    page = _reader(make_user).get(reverse("flywheel-demo")).content.decode()
    assert "the untrained agent pre-trained on 32000 grounding drills" in page and "untrained + drills" in page
    assert "difficulty levels 1, 2" in page
    root.notes = 'plan {"seed": 0, "levels": [2]}'  # a plan at one level above the first names it too
    root.save()
    page = _reader(make_user).get(reverse("flywheel-demo")).content.decode()
    assert "difficulty level 2." in page and "temperature" not in page
    root.notes = 'plan {"seed": 0, "levels": [2], "rft": {"temperature": 0.5}}'  # a cooler RFT is named
    root.save()
    assert "difficulty level 2, RFT sampled at temperature 0.5." in _reader(make_user).get(
        reverse("flywheel-demo")).content.decode()  # fmt: skip
    root.notes = 'plan {"seed": 0, "levels": [2], "annotate_per_iteration": 48, "rft_tasks_per_iteration": 30}'
    root.save()
    assert "level 2, 48 training instances annotated live and 30 sampled by RFT each iteration." in _reader(
        make_user).get(reverse("flywheel-demo")).content.decode()  # fmt: skip
    root.notes = 'flywheel demonstration: untrained agent; plan {"seed": 0, "drills": 32000, "levels": [1, 2]}'
    root.save()
    assert plot_png(build_report(root))[:8] == b"\x89PNG\r\n\x1a\n"
    # The drills ran before any iteration: they are iteration 0's first stage, in its wall time and the total.
    for n, iteration in enumerate(Iteration.objects.filter(base_model__isnull=False).order_by("created_at")):
        start = root.created_at + timedelta(seconds=100 * n)
        Iteration.objects.filter(pk=iteration.pk).update(started_at=start, finished_at=start + timedelta(seconds=90))
    undrilled = build_report(root)
    root.metrics = {"drills": {"count": 32000, "seconds": 400.0}}
    root.save()
    drilled = build_report(root)
    zero = drilled["iterations"][0]
    assert next(iter(zero["stages"])) == "drills" and zero["stages"]["drills"]["seconds"] == 400.0
    assert (undrilled["iterations"][0]["wall_s"], zero["wall_s"]) == (90.0, 490.0)
    # iteration 1's annotation was made before its row started (at the fixture's start): its wall time counts it
    second = Iteration.objects.get(pk=undrilled["iterations"][1]["iteration"])
    made = min(Trajectory.objects.filter(validations__iteration=second).values_list("created_at", flat=True))
    assert made < second.started_at
    assert undrilled["iterations"][1]["wall_s"] == round((second.finished_at - made).total_seconds(), 1)
    assert drilled["wall_s"] == undrilled["wall_s"] + 400.0
    assert "drills" not in drilled["iterations"][1]["stages"]
    page = _reader(make_user).get(reverse("flywheel-demo")).content.decode()
    assert re.search(r"<td>drills</td>\s*<td>[^<]*</td>\s*<td>400.0</td>", page), page


def test_held_out_results_of_tasks_no_longer_in_the_pool_are_counted_by_their_ids(db):
    """A run's tasks may be deleted later: family and level then come from the suite's external ids."""
    from flywheel.demo_report import heldout

    result = heldout({"by_task": {"suite-radio-heldout-s3-d2@demo-agent-s0-x": {"episodes": 1, "successes": 1},
                                  "suite-search-heldout-s4-d1": {"episodes": 1, "successes": 0}}})  # fmt: skip
    assert {name: r["n"] for name, r in result["by_family"].items()} == {"radio": 1, "search": 1}
    assert {level: r["successes"] for level, r in result["by_level"].items()} == {"1": 0, "2": 1}
