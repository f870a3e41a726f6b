"""The task suite without a sandbox: seeded generation, the train/held-out split, the task format the importer
accepts, and the suite_tasks command (its sandbox runs are in test_suite_sandbox.py)."""

import json

import pytest
from django.core.management import CommandError, call_command

from annotation_app.models import Task
from annotation_app.task_import import validate_record
from sandbox.suite import (
    accepts,
    agrees,
    families,
    family,
    instance,
    make_task,
    oracle_action,
    seeds,
    spec_of,
    split_of,
    suite_tasks,
    task_id,
    wrong_action,
)


def test_at_least_twelve_families_of_both_kinds_each_described():
    names = families()
    assert len(names) >= 12 and len(set(names)) == len(names)
    assert {family(n).platform for n in names} == {"browser", "desktop"}
    assert all(family(n).summary and family(n).levels for n in names)
    assert any(len(family(n).levels) > 1 for n in names)


@pytest.mark.parametrize("name", families())
def test_generation_is_deterministic_per_seed_and_varies_across_seeds(name):
    level = max(family(name).levels)
    train = seeds("train", 8)
    first = [make_task(name, s, "train", level) for s in train]
    again = [make_task(name, s, "train", level) for s in train]
    assert json.dumps(first) == json.dumps(again)
    assert len({json.dumps(t["config"]) + t["instruction"] for t in first}) >= 4, "seeds barely change the instance"


def test_train_and_heldout_seeds_never_overlap_and_tasks_know_their_split():
    train, heldout = seeds("train", 200), seeds("heldout", 50)
    assert not set(train) & set(heldout) and len(set(train)) == 200 and len(set(heldout)) == 50
    assert all(split_of(s) == "train" for s in train) and all(split_of(s) == "heldout" for s in heldout)
    task = make_task("slider", heldout[0], "heldout", 1)
    assert task["metadata"] == {"suite": "slider", "seed": heldout[0], "split": "heldout", "difficulty": 1}
    assert task["id"] == task_id("slider", heldout[0], 1)
    with pytest.raises(ValueError, match="belongs to the heldout split"):
        make_task("slider", heldout[0], "train", 1)
    with pytest.raises(ValueError, match="difficulty levels"):
        make_task("slider", train[0], "train", 9)
    with pytest.raises(ValueError, match="unknown task family 'nope'"):
        make_task("nope", train[0], "train", 1)
    with pytest.raises(ValueError, match="non-negative integer"):
        split_of(-1)


def test_oracle_action_refuses_a_task_of_another_family():
    task = make_task("click-button", seeds("train", 1)[0], "train", 1)
    with pytest.raises(ValueError, match="belongs to family 'click-button'"):
        oracle_action("slider", task, {})


def test_the_editor_oracle_saves_as_when_the_file_went_under_another_name():
    """Under load the Save dialog once took only part of the typed name ("summ"): Save (ctrl+s) then kept writing
    ~/summ, and the oracle never reached the goal. A document saved under any other name gets Save As."""
    task = make_task("editor-save", 1, "train", 1)
    name = spec_of(task)[1]["name"]
    home = {"files": {name: None}}
    assert oracle_action("editor-save", task, {**home, "active": "*~/summ - Mousepad"}) == "hotkey(key='ctrl shift s')"
    assert oracle_action("editor-save", task, {**home, "active": "~/summ - Mousepad"}) == "hotkey(key='ctrl shift s')"
    assert oracle_action("editor-save", task, {**home, "active": "*Untitled 1 - Mousepad"}) == "hotkey(key='ctrl s')"
    assert oracle_action("editor-save", task, {**home, "active": f"*~/{name} - Mousepad"}) == "hotkey(key='ctrl s')"
    assert oracle_action("editor-save", task, {**home, "active": "Untitled 1 - Mousepad"}).startswith("type(")


def test_every_task_passes_the_importers_checks():
    tasks = suite_tasks(train=2, heldout=1)
    assert len({t["id"] for t in tasks}) == len(tasks)
    for task in tasks:
        values, problems = validate_record(task)
        assert not problems, (task["id"], problems)
        assert values["platform"] == task["platform"] and values["metadata"]["suite"] == task["metadata"]["suite"]


@pytest.mark.django_db
def test_the_command_writes_and_imports_the_suite_once(tmp_path, capsys):
    out = tmp_path / "suite.jsonl"
    call_command("suite_tasks", "--out", str(out), "--import", "--families", "click-button,terminal-file",
                 "--train", "3", "--heldout", "1", "--levels", "1")  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 8 and Task.objects.filter(external_id__startswith="suite-").count() == 8
    task = Task.objects.get(external_id=lines[0]["id"])
    assert task.metadata["suite"] == "click-button" and task.platform == "browser"
    assert spec_of(task)[1] == instance("click-button", task.metadata["seed"], 1)  # the oracle reads a Task row too
    assert Task.objects.filter(metadata__split="heldout").count() == 2
    call_command("suite_tasks", "--import", "--families", "click-button", "--train", "3", "--heldout", "1",
                 "--levels", "1")  # fmt: skip
    assert "0 created, 4 skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--import", "--families", "click-button,teleport"], "unknown family teleport"),
        ([], "say what to do"),
        (["--import", "--train", "-1"], "--train must be between 0"),
        (["--import", "--levels", "one"], "--levels takes comma-separated integers"),
    ],
)
def test_the_command_refuses_bad_arguments_clearly(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("suite_tasks", *args)


STATE = {  # what page.PROBE reads: two buttons, a slider track and its handle
    "w": 1280, "h": 800, "sx": 0, "sy": 0, "st": {"clicked": None},
    "els": {
        "b0": {"x": 100, "y": 100, "w": 150, "h": 50, "shown": True},
        "b1": {"x": 300, "y": 100, "w": 150, "h": 50, "shown": True},
        "s0": {"x": 200, "y": 400, "w": 500, "h": 12, "shown": True},
        "h0": {"x": 438, "y": 388, "w": 24, "h": 36, "shown": True},
    },
}  # fmt: skip


@pytest.mark.parametrize(
    ("oracle", "proposed", "same"),
    [
        ("click(start_box='(175,125)')", "click(start_box='(104,146)')", True),  # anywhere on the same button
        ("click(start_box='(175,125)')", "click(start_box='(310,125)')", False),  # the other button
        ("click(start_box='(175,125)')", "left_double(start_box='(175,125)')", False),
        ("click(start_box='(900,600)')", "click(start_box='(905,596)')", True),  # no element there: near enough
        ("click(start_box='(900,600)')", "click(start_box='(930,600)')", False),
        ("drag(start_box='(450,406)', end_box='(550,406)')", "drag(start_box='(445,400)', end_box='(556,410)')", True),
        ("drag(start_box='(450,406)', end_box='(550,406)')", "drag(start_box='(450,406)', end_box='(575,406)')", False),
        ("type(content='apple\\n')", "type(content='apple\\n')", True),
        ("type(content='apple\\n')", "type(content='apple')", False),
        ("hotkey(key='ctrl a')", "hotkey(key='a ctrl')", True),
        ("scroll(start_box='(640,400)', direction='down')", "scroll(direction='down')", True),
        ("scroll(start_box='(640,400)', direction='down')", "scroll(direction='up')", False),
        ("finished(content='done')", "finished(content='clicked it')", True),
        ("click(start_box='(175,125)')", "clik(start_box='(175,125)')", False),  # does not parse
        ("click(start_box='(175,125)')", "click(start_box='(175,125)')\n\nwait()", False),
    ],
)
def test_the_judge_accepts_a_proposal_that_does_what_the_oracle_does(oracle, proposed, same):
    assert agrees(oracle, proposed, STATE) is same


def test_accepts_compares_with_the_families_own_oracle():
    task = make_task("click-button", seeds("train", 1)[0], "train", 1)
    spec = instance("click-button", task["metadata"]["seed"], 1)
    boxes = {f"b{i}": {"x": x, "y": y, "w": 150, "h": 50, "shown": True} for i, (x, y) in enumerate(spec["pos"])}
    state = {"w": 1280, "h": 800, "st": {"clicked": None}, "els": boxes}
    target, other = boxes[f"b{spec['target']}"], boxes[f"b{(spec['target'] + 1) % 3}"]
    assert accepts("click-button", task, state, f"click(start_box='({target['x'] + 5},{target['y'] + 45})')")
    assert not accepts("click-button", task, state, f"click(start_box='({other['x'] + 75},{other['y'] + 25})')")
    assert accepts("click-button", task, state, wrong_action("click-button", task, state)) is False


def test_the_same_seeds_give_the_same_tasks_in_another_process_whatever_its_hash_seed():
    import hashlib
    import subprocess
    import sys

    from ..servers import ROOT

    code = (
        "import hashlib, json; from sandbox.suite import suite_tasks; "
        "print(hashlib.sha256(json.dumps(suite_tasks(train=2, heldout=1)).encode()).hexdigest())"
    )
    here = hashlib.sha256(json.dumps(suite_tasks(train=2, heldout=1)).encode()).hexdigest()
    for hash_seed in ("1", "2"):
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == here
