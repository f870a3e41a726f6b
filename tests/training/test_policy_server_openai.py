"""The embedded policy server answers the official `openai` client as vLLM's OpenAI server does: server-sent-event
streaming, per-token log-probs, 404 for an unknown model, `n` candidates, grammar-constrained decoding with all of
them; and the trainer's remote rollouts record the log-probs the server sampled with. Real server process, real
client, tiny checkpoint built from a config."""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
import time

import httpx
import openai
import pytest
import torch
from PIL import Image

from sandbox.action_regex import proposal_regex
from training.policy.prompts import build_messages

from ..servers import ROOT, answers, free_port, running

MODEL = "tiny-uitars"
HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server_url(tiny_vision, tmp_path_factory) -> str:
    """`python -m training.policy.server` on the tiny vision-language checkpoint; yields its OpenAI base URL."""
    port = free_port()
    command = [sys.executable, "-m", "training.policy.server", "--checkpoint", str(tiny_vision)]
    command += ["--name", MODEL, "--port", str(port), "--threads", "1"]
    log = tmp_path_factory.mktemp("logs") / "policy.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with running(command, env, log, answers(f"http://127.0.0.1:{port}/health")):
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def client(server_url) -> openai.OpenAI:
    with openai.OpenAI(base_url=server_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def jpeg(width: int = 644, height: int = 420) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "gray").save(buffer, "JPEG")
    return buffer.getvalue()


def joined(stream) -> tuple[dict[int, str], dict[int, str | None], list]:  # type: ignore[no-untyped-def]
    """Per choice index: the concatenated content deltas and the finish reason; and every chunk."""
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    chunks = list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            finish[choice.index] = choice.finish_reason or finish.get(choice.index)
    return texts, finish, chunks


def test_streamed_deltas_join_to_the_non_streaming_greedy_answer(client, server_url):
    args = {"model": MODEL, "messages": HELLO, "temperature": 0, "max_tokens": 24}
    whole = client.chat.completions.create(**args)
    texts, finish, chunks = joined(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    assert texts == {0: whole.choices[0].message.content} and finish == {0: whole.choices[0].finish_reason}
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].model == MODEL
    # vLLM's shape: one chunk per token after the role chunk, then the usage alone in a chunk with no choices
    assert len(chunks) == 1 + whole.usage.completion_tokens + 1
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    with httpx.stream("POST", f"{server_url}/chat/completions", json={**args, "stream": True}, timeout=120) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        events = [line for line in raw.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["object"] == "chat.completion.chunk" for line in events[:-1])


def test_logprobs_are_one_per_generated_token_finite_sorted_and_the_models_own(client, tiny_vision):
    answer = client.chat.completions.create(
        model=MODEL, messages=HELLO, n=2, temperature=1.0, seed=7, max_tokens=12, logprobs=True, top_logprobs=5,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    data = answer.model_dump()
    assert answer.usage.completion_tokens == sum(len(c["token_ids"]) for c in data["choices"])
    model = None
    for choice in data["choices"]:
        entries = choice["logprobs"]["content"]
        assert len(entries) == len(choice["token_ids"]) > 0  # the end token, when there is one, counts too
        for entry in entries:
            assert math.isfinite(entry["logprob"]) and entry["logprob"] <= 0
            top = [t["logprob"] for t in entry["top_logprobs"]]
            assert len(top) == 5 and top == sorted(top, reverse=True) and entry["logprob"] <= top[0] + 1e-6
            assert entry["bytes"] == list(entry["token"].encode("utf-8", errors="replace"))
        # the same numbers come out of a forward pass over prompt + tokens: the raw distribution the trainer uses
        if model is None:
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_pretrained(tiny_vision, dtype=torch.float32).eval()
        prompt = data["prompt_token_ids"]
        ids = torch.tensor([prompt + choice["token_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, ids[0, len(prompt) :, None])
        assert torch.allclose(torch.tensor([e["logprob"] for e in entries]), expected[:, 0], atol=1e-4)
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_an_unknown_model_is_a_404_and_the_models_list_names_the_served_one(client, server_url):
    assert [m.id for m in client.models.list()] == [MODEL]
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2, stream=stream)
        assert caught.value.body == {"message": "The model `gpt-4o` does not exist.", "type": "NotFoundError",
                                     "param": "model", "code": 404}  # fmt: skip
    # vLLM's rule: a request without a model name gets the served one
    response = httpx.post(f"{server_url}/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=120)
    assert response.status_code == 200 and response.json()["model"] == MODEL


def test_bad_requests_are_openai_400s_never_a_stream_or_a_500(client):
    bad = [
        ({"top_logprobs": 2}, "`logprobs` must be set to true"),
        ({"extra_body": {"structured_outputs": {"regex": "(("}}}, "the regex does not compile"),
    ]
    for stream in (False, True):
        for extra, message in bad:
            with pytest.raises(openai.BadRequestError, match=message):
                client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, stream=stream, **extra)
    with pytest.raises(openai.BadRequestError, match="only be defined when `stream=True`"):
        client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=2, stream_options={"include_usage": True}
        )


def test_constrained_candidates_stream_with_logprobs_as_they_are_answered_whole(client):
    regex = proposal_regex(644, 420)
    args = {
        "model": MODEL, "messages": build_messages("Close the window", [], jpeg()), "n": 4, "seed": 3,
        "temperature": 1.0, "max_tokens": 200, "logprobs": True, "extra_body": {"structured_outputs": {"regex": regex}},
    }  # fmt: skip
    whole = client.chat.completions.create(**args)
    texts, finish, chunks = joined(client.chat.completions.create(**args, stream=True))
    assert texts == {c.index: c.message.content for c in whole.choices}  # same seed, same candidates
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert [c.finish_reason for c in whole.choices] == ["stop"] * 4
    assert all(re.fullmatch(regex, c.message.content) for c in whole.choices)
    streamed = {i: [e for c in chunks for ch in c.choices if ch.index == i and ch.logprobs
                    for e in ch.logprobs.content] for i in range(4)}  # fmt: skip
    for choice in whole.choices:
        assert [e.logprob for e in streamed[choice.index]] == [e.logprob for e in choice.logprobs.content]
        assert all(math.isfinite(e.logprob) for e in choice.logprobs.content)
    assert whole.usage.completion_tokens == sum(len(c.logprobs.content) for c in whole.choices)


def test_a_client_that_leaves_a_stream_stops_its_generation(client, server_url):
    """A grammar that only a 4096-letter answer completes keeps the model from ending early, whatever it would say,
    so 4096 tokens take minutes here; leaving after a few chunks must free the server at the next token, or the next
    request waits behind the abandoned one."""
    endless = [{"role": "user", "content": "hi"}]
    letters = {"structured_outputs": {"regex": "[a-z]{4096}"}}
    probe = client.chat.completions.create(model=MODEL, messages=endless, max_tokens=150, extra_body=letters)
    assert probe.choices[0].finish_reason == "length"
    body = {"model": MODEL, "messages": endless, "max_tokens": 4096, "stream": True, **letters}
    with httpx.stream("POST", f"{server_url}/chat/completions", json=body, timeout=120) as raw:
        for n, _ in enumerate(raw.iter_lines()):
            if n == 10:
                break
    started = time.monotonic()
    client.with_options(timeout=30).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert time.monotonic() - started < 30


def test_remote_rollouts_record_the_tokens_and_logprobs_they_were_sampled_with(server_url, tiny_vision):
    from transformers import AutoTokenizer

    from training.envs import CopyEnv
    from training.rollout import RemotePolicy, SamplingParams, run_episode

    remote = RemotePolicy(server_url, MODEL, SamplingParams(max_new_tokens=6))
    episode = run_episode(CopyEnv(turns=2), remote.generate_one, seed=5)
    turns = [m for m in episode.messages if m["role"] == "assistant"]
    assert len(turns) == 2
    tokenizer = AutoTokenizer.from_pretrained(tiny_vision)
    for turn in turns:
        assert 0 < len(turn["token_ids"]) == len(turn["logprobs"]) <= 6
        assert all(math.isfinite(x) and x <= 0 for x in turn["logprobs"])
        assert tokenizer.decode(turn["token_ids"], skip_special_tokens=True) == turn["content"]
        assert turn.get("truncated", False) == (turn["token_ids"][-1] != tokenizer.convert_tokens_to_ids("<|im_end|>"))
    json.dumps(episode.messages)  # stays the trainer's JSON episode format
    remote.record_logprobs = False
    reply, _ = remote.generate_one(CopyEnv().reset(1))
    assert reply.logprobs is None and reply.token_ids is None
