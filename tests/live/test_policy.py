"""The policy client against the embedded policy server over real HTTP: UI-TARS prompts, n candidates, constrained
decoding, clear errors, retries."""

from __future__ import annotations

import io
import re

import httpx
import pytest
from PIL import Image

from sandbox.action_regex import int_range, proposal_regex
from sandbox.actions import parse_step
from training.policy.client import PolicyClient, PolicyError, parse_proposal
from training.policy.prompts import Turn, build_messages


def jpeg(width: int = 644, height: int = 420, color: str = "gray") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 9), (0, 1931), (7, 130), (0, 1000), (1, 5000)])
def test_int_range_matches_exactly_the_range(lo, hi):
    pattern = re.compile(int_range(lo, hi))
    assert [n for n in range(6000) if pattern.fullmatch(str(n))] == list(range(lo, hi + 1))
    assert not pattern.fullmatch("0" + str(max(lo, 1)))  # no leading zeros


def test_every_string_of_the_proposal_regex_parses():
    pattern = re.compile(proposal_regex(100, 50))
    box = "'<|box_start|>({},{})<|box_end|>'"
    sample = f"Thought: go\nAction: drag(start_box={box.format(99, 0)}, end_box={box.format(0, 49)})"
    assert pattern.fullmatch(sample) and parse_step(sample).actions[0].end.y == 49
    assert not pattern.fullmatch(sample.replace("(0,49)", "(0,50)"))  # out of the image


def test_messages_keep_the_last_images_and_every_earlier_action():
    history = [Turn(jpeg(), f"thought {n}", f"click(start_box='({n},{n})')") for n in range(6)]
    messages = build_messages("Open the file", history, jpeg(), keep_images=3)
    images = [m for m in messages if isinstance(m["content"], list)]
    assistants = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(images) == 3 and len(assistants) == 6
    assert "Open the file" in messages[0]["content"] and "## Action Space" in messages[0]["content"]
    assert assistants[0] == "Thought: thought 0\nAction: click(start_box='(0,0)')"


def test_proposals_from_the_embedded_server_parse_and_stay_on_screen(policy_url):
    client = PolicyClient(policy_url, "tiny-uitars")
    messages = build_messages("Close the window", [], jpeg(644, 420))
    batch = client.propose(messages, width=644, height=420, n=4, seed=3, max_tokens=200)
    assert len(batch.proposals) == 4 and batch.model == "tiny-uitars" and batch.latency_ms > 0
    for proposal in batch.proposals:
        assert proposal.valid, proposal.raw
        assert all(0 <= x < 644 and 0 <= y < 420 for x, y in proposal.points)
        assert parse_step(proposal.raw).actions  # the raw text itself is UI-TARS output
    again = client.propose(messages, width=644, height=420, n=4, seed=3, max_tokens=200)
    assert [p.raw for p in again.proposals] == [p.raw for p in batch.proposals]  # seeded: reproducible
    client.close()


def test_greedy_first_puts_the_models_most_likely_answer_before_sampled_alternatives(policy_url):
    client = PolicyClient(policy_url, "tiny-uitars")
    messages = build_messages("Close the window", [], jpeg(644, 420))
    batch = client.propose(messages, width=644, height=420, n=3, seed=5, max_tokens=120, greedy_first=True)
    greedy = client.propose(messages, width=644, height=420, n=1, temperature=0, max_tokens=120)
    sampled = client.propose(messages, width=644, height=420, n=2, seed=5, max_tokens=120)
    assert [p.raw for p in batch.proposals] == [p.raw for p in greedy.proposals + sampled.proposals]
    assert batch.model == "tiny-uitars" and batch.latency_ms > 0
    client.close()


def test_unconstrained_output_of_a_random_model_is_shown_invalid_not_executed(policy_url):
    client = PolicyClient(policy_url, "tiny-uitars", constrain=False)
    batch = client.propose(build_messages("x", [], jpeg()), width=644, height=420, n=2, seed=1, max_tokens=30)
    assert [p.valid for p in batch.proposals] == [False, False]
    assert all(p.error.startswith("does not parse") and p.actions == [] for p in batch.proposals)


def test_parse_proposal_flags_points_outside_the_screenshot():
    proposal = parse_proposal("Thought: t\nAction: click(start_box='<|box_start|>(700,10)<|box_end|>')", 644, 420)
    assert not proposal.valid and "outside the 644x420 screenshot" in proposal.error
    assert proposal.points == [[700, 10]]


def test_bad_requests_get_openai_style_400s(policy_url):
    bad_image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
    remote = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}
    for message, expected in [(bad_image, "not a readable image"), (remote, "data URLs")]:
        response = httpx.post(f"{policy_url}/chat/completions", json={"messages": [message]})
        assert response.status_code == 400 and expected in response.json()["error"]["message"]
    assert httpx.post(f"{policy_url}/chat/completions", json={"messages": [], "n": 99}).status_code == 422
    with pytest.raises(PolicyError, match="refused the request"):
        PolicyClient(policy_url, "m").complete({"messages": [bad_image]})


def test_an_unreachable_server_fails_after_the_retries():
    client = PolicyClient("http://127.0.0.1:9/v1", "m", retries=2, timeout_s=1)
    with pytest.raises(PolicyError, match="failed after 3 tries"):
        client.propose([{"role": "user", "content": "hi"}], width=10, height=10)


def test_trainer_rollouts_reach_the_embedded_server_with_images_as_data_urls(policy_url, tiny_checkpoint, tmp_path):
    from transformers import GenerationConfig

    from training.envs import CopyEnv
    from training.rollout import RemotePolicy, SamplingParams, run_episode

    Image.new("RGB", (56, 56), "white").save(tmp_path / "shot.png")
    remote = RemotePolicy(policy_url, "tiny-uitars", SamplingParams(max_new_tokens=3))
    remote.version = 4
    image_turn = [{"role": "user", "content": [{"type": "text", "text": "what is this"},
                                               {"type": "image", "image": "shot.png"}]}]  # fmt: skip
    reply, version = remote.generate_one(image_turn, base_dir=tmp_path)
    assert version == 4 and isinstance(reply.text, str)
    remote.sampling = SamplingParams(max_new_tokens=24)
    seeded = [remote.generate_one(image_turn, base_dir=tmp_path, seed=11)[0] for _ in range(2)]
    assert seeded[0] == seeded[1]  # a seeded request samples the same reply again
    remote.sampling = SamplingParams(max_new_tokens=3)
    episode = run_episode(CopyEnv(turns=2), remote.generate_one, seed=3)
    assert [m["version"] for m in episode.messages if m["role"] == "assistant"] == [4, 4]
    # one token: either the end token (a reply that stopped) or a cut reply, as the server's finish_reason says (a
    # cut one may still read "": a special token such as <|box_start|> writes no text)
    remote.sampling = SamplingParams(max_new_tokens=1)
    end = GenerationConfig.from_pretrained(tiny_checkpoint).eos_token_id  # the server's end token, as it reads it
    end = end[0] if isinstance(end, list) else end
    for seed in range(4):
        reply, _ = remote.generate_one(CopyEnv().reset(seed))
        assert reply.truncated == (reply.token_ids != (end,)), reply
