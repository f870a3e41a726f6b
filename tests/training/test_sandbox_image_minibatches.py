"""Sandbox episodes carry screenshots: a PPO minibatch of some episodes must take exactly their images along (the
model reads `pixel_values` in row order), and the local policy must generate with the images it is shown. Real tiny
Qwen2.5-VL built from a config, real images through its processor."""

from __future__ import annotations

import torch
from PIL import Image

from training.data import Episode, Renderer, collate
from training.models import load_actor, load_tokenizer, token_log_probs
from training.ppo import select_rows
from training.rollout import LocalPolicy, SamplingParams


def _episode(tmp_path, name: str, sizes: list[tuple[int, int]], colour: str) -> Episode:
    """An episode with one screenshot per turn, of the given sizes (so images differ in patch count)."""
    messages: list[dict] = [{"role": "system", "content": "Do the task."}]
    for n, size in enumerate(sizes):
        Image.new("RGB", size, colour).save(tmp_path / f"{name}-{n}.png")
        messages.append({"role": "user", "content": [{"type": "image", "image": f"{name}-{n}.png"}]})
        messages.append({"role": "assistant", "content": f"Thought: {name} {n}\nAction: wait()"})
    return Episode(messages, id=name, meta={"base_dir": str(tmp_path)})


def test_a_minibatch_of_episodes_scores_as_those_episodes_alone_do(tiny_vision, tmp_path):
    tokenizer, processor = load_tokenizer(tiny_vision)
    renderer = Renderer(tokenizer, image_processor=processor)
    model = load_actor(tiny_vision).eval()
    episodes = [
        _episode(tmp_path, "a", [(448, 336), (224, 224)], "white"),
        Episode([{"role": "user", "content": "no screen"}, {"role": "assistant", "content": "ok"}], id="t"),
        _episode(tmp_path, "b", [(336, 448)], "black"),
    ]
    samples = [renderer.render(e) for e in episodes]
    batch = collate(samples, tokenizer.pad_token_id)
    batch["image_counts"] = torch.tensor([2, 0, 1])
    with torch.no_grad():
        for rows in ([2, 0], [1], [0], [1, 2]):
            mini = select_rows(batch, torch.tensor(rows))
            assert mini["input_ids"].shape[0] == len(rows)
            got, _ = token_log_probs(model, mini)
            for position, row in enumerate(rows):
                alone, _ = token_log_probs(model, collate([samples[row]], tokenizer.pad_token_id))
                n = alone.shape[1]
                torch.testing.assert_close(got[position, :n], alone[0], rtol=1e-4, atol=1e-4)
    assert "pixel_values" not in select_rows(batch, torch.tensor([1]))


def test_the_local_policy_generates_from_screenshots_and_their_pixels_matter(tiny_vision, tmp_path):
    """Replies to conversations with screenshots, batched (left padding, two images) and alone; and the pixels
    reach the model: two screenshots give different next-token scores (compared on scores, not on words)."""
    tokenizer, processor = load_tokenizer(tiny_vision)
    renderer = Renderer(tokenizer, image_processor=processor)
    model = load_actor(tiny_vision).eval()
    policy = LocalPolicy(model, renderer, SamplingParams(max_new_tokens=4, temperature=0.0))
    policy.base_dir = tmp_path
    conversations = []
    for colour in ("white", "black"):
        Image.new("RGB", (448, 336), colour).save(tmp_path / f"{colour}.png")
        conversations.append([{"role": "user", "content": [{"type": "text", "text": "Next step?"},
                                                           {"type": "image", "image": f"{colour}.png"}]}])  # fmt: skip
    replies, version = policy.generate(conversations)  # one batch, two rows with an image each
    assert len(replies) == 2 and version == 0 and all(isinstance(r.text, str) for r in replies)
    (reply,), _ = policy.generate(conversations[:1])
    assert isinstance(reply.text, str)
    inputs = [renderer.prompt_inputs(c, tmp_path) for c in conversations]
    with torch.no_grad():
        last = [
            model(input_ids=torch.tensor([i["input_ids"]]), pixel_values=i["pixel_values"],
                  image_grid_thw=i["image_grid_thw"]).logits[0, -1]
            for i in inputs
        ]  # fmt: skip
    assert not torch.allclose(last[0], last[1])


def test_policies_never_generate_the_vision_placeholders(tiny_vision, tmp_path):
    """A sampled <|image_pad|> would ask the renderer for an image the episode does not have (PPO then failed in
    prepare); the tiny vocabulary makes one likely in a few hundred sampled tokens unless generation suppresses it."""
    from training.data import EpisodeFormatError, vision_token_ids

    tokenizer, processor = load_tokenizer(tiny_vision)
    renderer = Renderer(tokenizer, image_processor=processor)
    vision = set(vision_token_ids(tokenizer))
    assert len(vision) == 4
    policy = LocalPolicy(load_actor(tiny_vision).eval(), renderer, SamplingParams(max_new_tokens=96, temperature=1.5))
    policy.base_dir = tmp_path
    Image.new("RGB", (448, 336), "white").save(tmp_path / "s.png")
    content = [{"type": "text", "text": "Next?"}, {"type": "image", "image": "s.png"}]
    conversation = [{"role": "user", "content": content}]
    replies, _ = policy.generate([conversation] * 8)
    generated = [t for r in replies for t in tokenizer(r.text, add_special_tokens=False)["input_ids"]]
    assert len(generated) > 300 and not vision & set(generated)
    # And an episode that does spell one out is refused with a message, not an IndexError.
    with_pad = [*conversation, {"role": "assistant", "content": "Thought: x<|image_pad|>\nAction: wait()"}]
    episode = Episode(id="e", messages=with_pad, meta={"base_dir": str(tmp_path)})
    try:
        renderer.render(episode)
    except EpisodeFormatError as exc:
        assert "image placeholders" in str(exc)
    else:
        raise AssertionError("an extra image placeholder was rendered")
