"""The episode format: streaming reads, validation errors, rendering with a loss mask, rewards and images."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from training.data import Episode, EpisodeFormatError, Renderer, collate, read_episodes, write_episodes
from training.models import load_tokenizer
from training.rewards import Shaping

EPISODE = Episode(
    messages=[
        {"role": "system", "content": "Repeat each code exactly."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "ab", "reward": 0.25},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "c", "reward": 0.0},
    ],
    id="e1",
    reward=1.0,
)


def test_only_the_models_turns_are_trained_through_their_end_token(tiny_text):
    tokenizer, _ = load_tokenizer(tiny_text)
    sample = Renderer(tokenizer).render(EPISODE)
    trained = tokenizer.decode(sample.input_ids[sample.loss_mask.bool()])
    assert trained == "ab<|im_end|>c<|im_end|>"
    assert tokenizer.decode(sample.input_ids) == tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in EPISODE.messages], tokenize=False
    )
    # turn rewards sit on each turn's last token; the outcome is added on the last turn
    assert sample.turn_ends == [i for i in range(len(sample)) if sample.input_ids[i] == tokenizer.eos_token_id
                                and sample.loss_mask[i] == 1]  # fmt: skip
    assert sample.rewards[sample.turn_ends[0]] == 0.25 and sample.rewards[sample.turn_ends[1]] == 1.0
    assert float(sample.rewards.sum()) == 1.25


def test_continual_pretraining_trains_every_token(tiny_text):
    tokenizer, _ = load_tokenizer(tiny_text)
    sample = Renderer(tokenizer, mode="ct").render(EPISODE)
    assert bool(sample.loss_mask.all())
    with pytest.raises(ValueError, match="mode"):
        Renderer(tokenizer, mode="rl")


def test_files_round_trip_and_stream_gzip(tmp_path):
    episodes = [Episode(messages=EPISODE.messages, id=f"e{n}", reward=float(n)) for n in range(5)]
    assert write_episodes(tmp_path / "a.jsonl.gz", episodes) == 5
    write_episodes(tmp_path / "b.jsonl", episodes[:2])
    read = list(read_episodes(tmp_path))
    assert [e.id for e in read] == ["e0", "e1", "e2", "e3", "e4", "e0", "e1"]
    assert read[3].reward == 3.0 and read[0].messages == EPISODE.messages


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "not JSON"),
        ('{"messages": []}', "'messages' must be a non-empty list"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', r"messages\[0\].role"),
        ('{"messages": [{"role": "assistant", "content": [{"type": "text", "text": "x"}]}]}', "must be a string"),
        ('{"messages": [{"role": "user", "content": "x"}], "reward": "high"}', "'reward' must be a number"),
        ('{"messages": [{"role": "user", "content": "x"}], "score": 1}', "unknown field"),
    ],
)
def test_bad_lines_are_named_by_file_line_and_field(tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(EPISODE.to_json() + "\n" + line + "\n")
    with pytest.raises(EpisodeFormatError, match=expected) as caught:
        list(read_episodes(path))
    assert "bad.jsonl:2" in str(caught.value)


def test_images_expand_to_one_pad_per_merged_patch(tiny_vision, tmp_path):
    tokenizer, processor = load_tokenizer(tiny_vision)
    Image.new("RGB", (448, 336), "white").save(tmp_path / "s0.png")
    line = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Open it"},
                                                      {"type": "image", "image": "s0.png"}]},
                         {"role": "assistant", "content": "Thought: go\nAction: wait()"}]}  # fmt: skip
    (tmp_path / "v.jsonl").write_text(json.dumps(line) + "\n")
    (episode,) = read_episodes(tmp_path / "v.jsonl")
    sample = Renderer(tokenizer, image_processor=processor).render(episode)
    pads = int((sample.input_ids == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
    assert sample.image_grid_thw is not None and pads == int(sample.image_grid_thw.prod()) // 4
    batch = collate([sample], tokenizer.pad_token_id)
    from training.models import load_actor, token_log_probs

    log_probs, _ = token_log_probs(load_actor(tiny_vision), batch)  # the VL model takes the batch as it is
    assert log_probs.shape == (1, len(sample) - 1) and torch.isfinite(log_probs).all()
    without_processor = Renderer(tokenizer)
    with pytest.raises(EpisodeFormatError, match="no image processor"):
        without_processor.render(episode)


def test_shaping_penalises_truncation_overlong_turns_and_extra_steps(tiny_text):
    tokenizer, _ = load_tokenizer(tiny_text)
    episode = Episode(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "x" * 9, "truncated": True},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "z"},
    ])  # fmt: skip
    sample = Renderer(tokenizer).render(episode)
    shaping = Shaping(format_penalty=0.5, max_turn_tokens=10, overlong_buffer=4, overlong_penalty=1.0,
                      step_budget=2, step_penalty=0.1)  # fmt: skip
    added = shaping.apply(sample)
    first, second, third = sample.turn_ends
    # turn 1: 9 letters + end token = 10 tokens, 4 past the soft limit of 6 → the full overlong penalty
    assert sample.rewards[first] == pytest.approx(-0.5 - 1.0)
    assert sample.rewards[second] == 0.0
    assert sample.rewards[third] == pytest.approx(-0.1)
    assert added == pytest.approx({"format": -0.5, "overlong": -1.0, "steps": -0.1})
