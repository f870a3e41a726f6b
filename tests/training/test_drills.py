"""Grounding drills (training/drills.py): each is a valid one-turn episode whose reply clicks the line the instruction
names, in the exact form the agent's grounded decoding accepts; the drills repeat from a seed and draw their labels
from the suite's word pools only; `python -m training agent-drill` trains an agent on them once and keeps the result."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import regex

from sandbox.action_regex import grounded_regex, instruction_quotes, outline_points
from sandbox.suite.words import CATEGORIES, LABELS, WORDS
from training.agent import AgentConfig, build_agent
from training.data import Renderer, validate
from training.drills import FRAME, drill_agent, drills
from training.models import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_the_same_seed_gives_the_same_drills_and_another_seed_others():
    assert [e.to_json() for e in drills(20, seed=3)] == [e.to_json() for e in drills(20, seed=3)]
    assert [e.instruction for e in drills(20, seed=3)] != [e.instruction for e in drills(20, seed=4)]


def test_each_reply_clicks_the_named_line_in_the_form_grounded_decoding_accepts():
    suite_words = set(LABELS) | set(WORDS) | {w for words in CATEGORIES.values() for w in words}
    targets = set()
    for episode in drills(200, seed=0):
        validate(json.loads(episode.to_json()), "drill")
        outline = episode.messages[1]["content"][0]["text"]
        reply = episode.messages[2]["content"]
        elements = outline_points(outline)
        labels = [json.loads(re.match(r'\S+ ("[^"]*")', line)[1]) for line, _, _ in elements]
        assert 2 <= len(labels) <= 6 and len(set(labels)) == len(labels) and set(labels) <= suite_words
        named = instruction_quotes(episode.instruction)[0]
        assert named in labels
        line, x, y = elements[labels.index(named)]
        assert 0 < x < FRAME[0] and 0 < y < FRAME[1]
        assert reply == f"Thought: I click {line}.\nAction: click(start_box='<|box_start|>({x},{y})<|box_end|>')"
        assert regex.fullmatch(grounded_regex(outline, FRAME[0], FRAME[1], instruction=episode.instruction), reply)
        targets.add(labels.index(named))
    assert targets == {0, 1, 2, 3, 4, 5}  # the named line is anywhere in the outline, not always first


def test_a_drill_renders_for_the_agent_with_the_loss_on_the_reply_only(tmp_path):
    agent = build_agent(tmp_path / "agent", AgentConfig(hidden=32, layers=1, heads=1))
    tokenizer, _ = load_tokenizer(agent)
    episode = drills(1, seed=0)[0]
    sample = Renderer(tokenizer).render(episode)
    assert tokenizer.decode(sample.input_ids[sample.loss_mask.bool()]) == episode.messages[2]["content"] + "<|im_end|>"
    assert f"Task: {episode.instruction}<|im_end|>" in tokenizer.decode(sample.input_ids)


def test_the_cli_drills_an_agent_once_and_keeps_its_decoding(tmp_path):
    agent = build_agent(tmp_path / "agent", AgentConfig(hidden=32, layers=1, heads=1))
    out = tmp_path / "drilled"
    command = [sys.executable, "-m", "training", "agent-drill", "--model", str(agent), "--out", str(out),
               "--count", "16", "--batch", "8", "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    final = Path(done.stdout.strip().splitlines()[-1])
    assert final == tmp_path / "drilled" / "final" and not (tmp_path / "drilled" / "drills.jsonl").exists()
    assert json.loads((final / "config.json").read_text())["action_decoding"] == "grounded"
    metrics = [json.loads(line) for line in (tmp_path / "drilled" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("step", 0) for m in metrics) == 2  # 16 drills, 8 a step, one pass
    assert (final / "model.safetensors").read_bytes() != (agent / "model.safetensors").read_bytes()
    trained = (final / "model.safetensors").stat().st_mtime_ns

    def no_training(config, on_step=None):  # a second call finds the drilled agent and trains nothing
        raise AssertionError(f"trained again: {config}")

    assert drill_agent(agent, tmp_path / "drilled", count=16, batch=8, progress=False, sft=no_training) == final
    assert (final / "model.safetensors").stat().st_mtime_ns == trained


def test_a_caller_hears_the_drills_trained_and_the_trainers_error(tmp_path):
    agent = build_agent(tmp_path / "agent", AgentConfig(hidden=32, layers=1, heads=1))
    heard: list[int] = []
    final = drill_agent(agent, tmp_path / "drilled", count=16, batch=8, progress=False, on_progress=heard.append)
    assert (final / "model.safetensors").is_file() and heard and heard[-1] == 16 and heard == sorted(heard)

    def broken(config, on_step=None):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        drill_agent(agent, tmp_path / "again", count=16, batch=8, sft=broken, on_progress=heard.append)


def test_a_drill_count_below_one_batch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one batch"):
        drill_agent(tmp_path / "agent", tmp_path / "drilled", count=4, batch=8, progress=False)
