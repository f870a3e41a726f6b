"""The suite agent's builder (training/agent.py): its config is checked, its chat template keeps only the instruction
of the computer-use prompt in training and in serving alike, and an episode with screenshot and outline renders with
the loss on the model's turns only."""

import json

import pytest
from PIL import Image

from training.agent import AgentConfig, build_agent
from training.data import Episode, Renderer
from training.models import load_tokenizer
from training.policy.prompts import COMPUTER_USE, build_messages
from training.policy.tiny import build_tiny_checkpoint


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    return build_agent(tmp_path_factory.mktemp("agent") / "init", AgentConfig(hidden=32, layers=1, heads=1))


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="image_tokens"):
        AgentConfig(image_tokens=2)
    with pytest.raises(ValueError, match="hidden must be"):
        AgentConfig(hidden=8)
    with pytest.raises(ValueError, match="multiple of 8"):
        build_tiny_checkpoint(tmp_path / "odd", hidden=48, heads=4)


def test_the_checkpoint_names_its_config_and_sees_small_screenshots(agent):
    assert json.loads((agent / "agent.json").read_text())["agent"]["hidden"] == 32
    _, processor = load_tokenizer(agent)
    grid = processor(images=[Image.new("RGB", (1288, 812))], return_tensors="pt")["image_grid_thw"][0]
    assert int(grid.prod()) // 4 <= AgentConfig().image_tokens * 1.2  # merged 2x2: vision tokens per screenshot


def test_the_template_keeps_the_instruction_and_trains_only_the_replies(agent, tmp_path):
    tokenizer, processor = load_tokenizer(agent)
    Image.new("RGB", (1288, 812), "white").save(tmp_path / "s0.jpg")
    system = COMPUTER_USE.format(language="English", instruction="Click the button labelled 'Save'.")
    outline = 'Interactive elements (role, label, state, centre):\nbutton "Save" (160,70)'
    reply = "Thought: I click button \"Save\" (160,70).\nAction: click(start_box='<|box_start|>(160,70)<|box_end|>')"
    observation = {"role": "user", "content": [{"type": "image", "image": "s0.jpg"}, {"type": "text", "text": outline}]}
    episode = Episode(
        messages=[{"role": "user", "content": system}, observation, {"role": "assistant", "content": reply}],
        meta={"base_dir": str(tmp_path)},
    )
    renderer = Renderer(tokenizer, image_processor=processor)
    text = renderer.template(episode.messages)
    assert "Task: Click the button labelled 'Save'.<|im_end|>" in text
    assert "## Action Space" not in text and outline in text
    sample = renderer.render(episode)
    trained = tokenizer.decode(sample.input_ids[sample.loss_mask.bool()])
    assert trained == reply + "<|im_end|>"
    # The serving path's prompt (what live annotation sends) is shortened the same way.
    served = build_messages("Click the button labelled 'Save'.", [], b"jpeg", observation_text=outline)
    assert served[-1]["content"][-1] == {"type": "text", "text": outline}
    plain = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
              [{"type": "text", "text": p["text"]} if p["type"] == "text" else {"type": "image"}
               for p in m["content"]]} for m in served]  # fmt: skip
    prompt = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert prompt == renderer.template(episode.messages[:2], generation_prompt=True)
