"""What evaluation and sandbox training stand on, without a desktop: Wilson's interval against published values, the
task file's shapes and its errors, the report's counts, and the CLI's answers to bad options (a message, exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.__main__ import main
from training.data import Episode
from training.envs import load_tasks
from training.evaluate import summarise, wilson_interval

ROOT = Path(__file__).resolve().parents[2]
EVALUATOR = {"func": "exact_match", "result": {"type": "vm_file", "path": "flag"},
             "expected": {"type": "rule", "rules": {"expected": "done"}}}  # fmt: skip


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [  # Newcombe (1998), Statistics in Medicine 17:857, table I, method 3 (Wilson score, no continuity correction)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (29, 29, 0.8830, 1.0),
        (5, 10, 0.2366, 0.7634),
    ],
)
def test_the_wilson_interval_matches_published_values(successes, n, low, high):
    got_low, got_high = wilson_interval(successes, n)
    assert (round(got_low, 4), round(got_high, 4)) == (low, high)
    assert got_low <= successes / n <= got_high


def test_the_wilson_interval_holds_its_rate_at_the_edges_and_refuses_impossible_counts():
    for n in range(1, 60):
        for successes in range(n + 1):
            low, high = wilson_interval(successes, n)
            assert 0.0 <= low <= successes / n <= high <= 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="between 0 and n"):
        wilson_interval(3, 2)


def test_task_files_are_read_in_every_shape_and_the_platforms_field_names(tmp_path):
    osworld = {"id": "a", "instruction": "Do a.", "config": [{"type": "sleep", "parameters": {"seconds": 0}}],
               "evaluator": EVALUATOR, "snapshot": "os"}  # fmt: skip
    platform = {"external_id": "b", "instruction": "Do b.", "setup_config": [], "evaluator": EVALUATOR}
    shapes = {
        "list.json": json.dumps([osworld, platform]),
        "wrapped.json": json.dumps({"tasks": [osworld, platform]}),
        "lines.jsonl": "\n" + json.dumps(osworld) + "\n\n" + json.dumps(platform) + "\n",
    }
    for name, text in shapes.items():
        (tmp_path / name).write_text(text)
        tasks = load_tasks(tmp_path / name)
        assert [t["id"] for t in tasks] == ["a", "b"], name
        assert tasks[0]["config"] == osworld["config"] and tasks[1]["config"] == [] and tasks[0]["snapshot"] == "os"
        assert all(t["evaluator"] == EVALUATOR for t in tasks)
    (tmp_path / "one.json").write_text(json.dumps(osworld))
    assert [t["id"] for t in load_tasks(tmp_path / "one.json")] == ["a"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no tasks"),
        ("[]", "no tasks"),
        ('{"id": "x", "instruction": "i", "evaluator": {}}\n{nope', ":2: not JSON"),
        (json.dumps([{"instruction": "i", "evaluator": EVALUATOR}]), "task 0: 'id' is missing"),
        (json.dumps([{"id": "x", "instruction": " ", "evaluator": EVALUATOR}]), "'instruction' must be"),
        (json.dumps([{"id": "x", "instruction": "i"}]), r"\(x\): 'evaluator' must be"),
        (json.dumps([{"id": "x", "instruction": "i", "config": {}, "evaluator": EVALUATOR}]), "'config' must be"),
        (json.dumps(["x"]), "a task is a JSON object"),
    ],
)
def test_a_bad_task_file_is_refused_naming_the_record(tmp_path, text, message):
    path = tmp_path / "tasks.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_tasks(path)
    with pytest.raises(ValueError, match="cannot read the task file"):
        load_tasks(tmp_path / "missing.json")


def _episode(task: str, seed: int, score: float, turn_rewards: list[float], **info: object) -> Episode:
    turns = [{"role": "assistant", "content": "x", "reward": r} for r in turn_rewards]
    return Episode([{"role": "user", "content": "go"}, *turns],
                   meta={"task_id": task, "seed": seed, "info": {"score": score, **info}})  # fmt: skip


def test_the_report_counts_successes_by_the_evaluators_score_per_task_with_errors_listed():
    episodes = [
        _episode("a", 0, 1.0, [-0.1, 1.0]),  # a success despite a format penalty: the score decides
        _episode("b", 1, 0.0, [-0.1, -0.1]),
        _episode("a", 2, 1.0, [1.0]),
        _episode("b", 3, 0.0, [0.0], evaluator_error="unknown getter"),
    ]
    lost = [{"seed": 5, "task_id": "a", "error": "the sandbox service did not answer"}]
    report = summarise(episodes, model="m", env="sandbox", errors=lost)
    assert (report["episodes"], report["successes"], report["success_rate"]) == (4, 2, 0.5)
    assert report["by_task"] == {"a": {"episodes": 2, "successes": 2}, "b": {"episodes": 2, "successes": 0}}
    assert (report["ci_low"], report["ci_high"]) == wilson_interval(2, 4)
    assert report["mean_return"] == pytest.approx((0.9 - 0.2 + 1.0 + 0.0) / 4)
    assert [e["seed"] for e in report["errors"]] == [5, 3] and "unknown getter" in report["errors"][1]["error"]
    strict = summarise(episodes, model="m", env="sandbox", threshold=2.0)
    assert strict["successes"] == 0 and strict["ci_low"] == 0.0 and strict["ci_high"] > 0.0
    empty = summarise([], model="m", env="copy")
    assert (empty["episodes"], empty["success_rate"], empty["ci_low"], empty["ci_high"]) == (0, 0.0, 0.0, 1.0)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """`python -m training ARGS` in this process: it must exit 2; its message."""
    with pytest.raises(SystemExit) as stopped:
        main(list(args))
    assert stopped.value.code == 2
    return capsys.readouterr().err


def test_the_cli_answers_bad_sandbox_options_with_a_message_before_loading_anything(tmp_path, capsys):
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps([{"id": "x", "instruction": "i"}]))
    good.write_text(json.dumps([{"id": "x", "instruction": "i", "evaluator": EVALUATOR}]))
    ppo = ("ppo", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "run"))
    runs = {  # each refused before a model is loaded (there is none) or a session leased
        "--env sandbox needs --tasks FILE": ("eval", "--model", "m", "--env", "sandbox"),
        "'evaluator' must be": ("eval", "--model", "m", "--env", "sandbox", "--tasks", str(bad)),
        "unknown sandbox option 'steps'": ("eval", "--model", "m", "--env", "sandbox:steps=2", "--tasks", str(good)),
        "max_steps must be a int": (*ppo, "--env", "sandbox:max_steps=x", "--tasks", str(good)),
        "needs --tasks FILE": (*ppo, "--env", "sandbox"),
        "'evaluator' must be ": (*ppo, "--env", "sandbox", "--tasks", str(bad)),
        "unknown environment 'nope'": ("eval", "--model", "m", "--env", "nope"),
        "--episodes must be at least 1": ("eval", "--model", "m", "--episodes", "0"),
    }
    for message, args in runs.items():
        err = refused(capsys, *args)
        assert message.strip() in err and "Traceback" not in err, (message, err)
    assert not (tmp_path / "run").exists()


def test_text_environments_report_a_success_rate_and_interval_too(tiny_text):
    done = cli("eval", "--model", str(tiny_text), "--env", "copy", "--episodes", "6", "--max-new-tokens", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 6 and report["by_task"]["copy"]["episodes"] == 6
    assert report["ci_low"] <= report["success_rate"] <= report["ci_high"] and report["errors"] == []
    assert {"mean_return", "stderr", "successes", "example"} <= set(report)
