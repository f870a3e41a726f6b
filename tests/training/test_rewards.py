"""Reward shaping's format check reads raw replies as the UI-TARS grammar does: space or a BOM before the first
section is not a format failure; text that is not UI-TARS output is."""

from __future__ import annotations

import pytest

from training.data import Episode, Renderer
from training.models import load_tokenizer
from training.rewards import Shaping

REPLIES = [
    (" Thought: Open the menu.\nAction: click(start_box='(10,20)')", 0.0),
    ("\n\ufeffThought: Done.\n  Action: finished(content='ok')", 0.0),
    ("Thought: It cannot be done.\nAction: fail()", 0.0),
    ("Action: left_single(start_box='<|box_start|>(10,20)<|box_end|>')", 0.0),
    ("Sure! Thought: x\nAction: wait()", -0.5),  # prose before the first section
    ("Thought: far away\nAction: click(start_box='(1e999,5)')", -0.5),
]


def test_format_penalty_follows_the_grammar_on_raw_replies(tiny_text):
    tokenizer, _ = load_tokenizer(tiny_text)
    messages = []
    for reply, _ in REPLIES:
        messages += [{"role": "user", "content": "screen"}, {"role": "assistant", "content": reply}]
    sample = Renderer(tokenizer).render(Episode(messages=messages))
    added = Shaping(format_penalty=0.5, grammar="ui-tars").apply(sample)
    assert [float(sample.rewards[end]) for end in sample.turn_ends] == pytest.approx([p for _, p in REPLIES])
    assert added["format"] == pytest.approx(-1.0)
