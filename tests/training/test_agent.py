"""The suite agent's builder (training/agent.py): its config is checked, its chat template keeps only the instruction
of the computer-use prompt in training and in serving alike, and an episode with screenshot and outline renders with
the loss on the model's turns only."""

import io
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


OUTLINE = (
    "Interactive elements (role, label, state, centre):\n"
    'button "Move" (475,314)\nbutton "Open" focused (994,544)\ntextbox "Street" value="" (717,541)\n'
    'button "Choose…" (181,220)'
)
CENTRES = {(475, 314), (994, 544), (717, 541), (181, 220)}


def _conversation(tmp_path, outline: str | None) -> list[dict]:
    Image.new("RGB", (1288, 812), "white").save(tmp_path / "s0.jpg")
    observation = [{"type": "image", "image": "s0.jpg"}] + ([{"type": "text", "text": outline}] if outline else [])
    system = COMPUTER_USE.format(language="English", instruction="Click the button labelled 'Open'.")
    return [{"role": "user", "content": system}, {"role": "user", "content": observation}]


def test_the_agent_decodes_grounded_clicks_only_at_outlined_elements(agent, tmp_path):
    """An untrained agent (random weights) sampled hot still writes a reply of the grammar whose click, if any, names
    an outline line and goes to its centre (training/policy/grounding.py); without an outline the reply is free."""
    from sandbox.action_regex import outline_points
    from sandbox.actions import parse_step
    from training.models import load_actor
    from training.policy.grounding import is_grounded
    from training.rollout import LocalPolicy, SamplingParams

    tokenizer, processor = load_tokenizer(agent)
    model = load_actor(agent)
    assert is_grounded(model.config)  # written by the builder, kept by every checkpoint saved from it
    policy = LocalPolicy(model, Renderer(tokenizer, image_processor=processor), SamplingParams(300, 1.5))
    policy.base_dir = tmp_path
    replies, _ = policy.generate([_conversation(tmp_path, OUTLINE)] * 12)
    lines = {line for line, _, _ in outline_points(OUTLINE)}
    for reply in replies:
        step = parse_step(reply.text)
        for action in step.actions:
            if action.name in ("click", "left_double", "right_single", "drag"):
                point = action.point if action.name != "drag" else action.start
                assert (point.x, point.y) in CENTRES, reply.text
                assert step.thought.split(" ", 2)[2].rstrip(".") in lines, reply.text
    assert all(not reply.truncated for reply in replies)  # the grammar's longest reply fits in 300 tokens
    assert policy._grounding([_conversation(tmp_path, None)], 10) == []  # no outline (a desktop): free decoding


def test_grounded_regex_accepts_outlined_clicks_and_free_non_pointing_actions():
    import regex

    from sandbox.action_regex import grounded_regex, outline_points

    assert outline_points(OUTLINE)[1] == ('button "Open" focused (994,544)', 994, 544)
    pattern = regex.compile(grounded_regex(OUTLINE, 1288, 812))
    box = "<|box_start|>({},{})<|box_end|>"
    ok = [
        f"Thought: I click button \"Open\" focused (994,544).\nAction: click(start_box='{box.format(994, 544)}')",
        "Thought: I type \"harbor\\n\".\nAction: type(content='harbor\\n')",
        "Thought: The task is done.\nAction: finished(content='clicked Open')",
        f"Thought: I drag button \"Move\" (475,314).\nAction: drag(start_box='{box.format(475, 314)}', "
        f"end_box='{box.format(10, 20)}')",
    ]
    refused = [
        f"Thought: I click button \"Open\" focused (994,544).\nAction: click(start_box='{box.format(475, 314)}')",
        f"Thought: I click button \"Close\" (10,10).\nAction: click(start_box='{box.format(10, 10)}')",
        "Thought: I click somewhere.\nAction: finished(content='x')",
        f"Thought: Anywhere.\nAction: click(start_box='{box.format(994, 544)}')",
        f"Thought: I drag button \"Move\" (475,314).\nAction: drag(start_box='{box.format(475, 314)}', "
        f"end_box='{box.format(1288, 20)}')",  # outside the model image
        "Thought: Done\x00.\nAction: finished(content='x')",  # a control character: PostgreSQL refuses NUL
        "Thought: Done.\nAction: type(content='a\x00')",
    ]
    assert all(pattern.fullmatch(text) for text in ok)
    # A byte-level tokenizer writes "…" one byte at a time: each reads as a replacement character until joined.
    assert pattern.fullmatch('Thought: I click button "Choose\ufffd\ufffd\ufffd', partial=True)
    assert not any(pattern.fullmatch(text) for text in refused)


def test_grounded_typing_copies_a_string_the_instruction_quotes():
    """A grounded `type` whose thought opens with "I type" copies a string the instruction quotes (with or without
    the Enter that submits it); an apostrophe quotes nothing, and another thought keeps typing free."""
    import regex

    from sandbox.action_regex import grounded_regex, instruction_quotes
    from training.policy.grounding import grounding_pattern, task_instruction

    assert instruction_quotes("Type 'forest' into the page's City field, then 'Oslo'.") == ["forest", "Oslo"]
    assert instruction_quotes("Don't click the user's button.") == []
    pattern = regex.compile(grounded_regex(OUTLINE, 1288, 812, instruction="Search for 'Main St' (press Enter)."))
    ok = [
        "Thought: I type \"Main St\".\nAction: type(content='Main St')",
        "Thought: I type \"Main St\\n\".\nAction: type(content='Main St\\n')",
        "Thought: Clear the field first.\nAction: type(content='anything')",
    ]
    refused = [
        "Thought: I type \"harbor\".\nAction: type(content='harbor')",
        "Thought: I type \"Main St\".\nAction: type(content='Main Street')",
        "Thought: I type \"Main St\\n\".\nAction: type(content='Main St')",
    ]
    assert all(pattern.fullmatch(text) for text in ok)
    assert not any(pattern.fullmatch(text) for text in refused)
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), "gray").save(buffer, "JPEG")
    messages = build_messages("Type 'forest' into the City field.", [], buffer.getvalue(), observation_text=OUTLINE)
    assert task_instruction(messages) == "Type 'forest' into the City field."
    grounded = regex.compile(grounding_pattern(messages, 1288, 812))
    assert grounded.fullmatch("Thought: I type \"forest\".\nAction: type(content='forest')")
    assert not grounded.fullmatch("Thought: I type \"piano\".\nAction: type(content='piano')")


def test_the_policy_server_decodes_a_grounded_checkpoint_the_same_way(agent):
    """The embedded server reads the rule from the checkpoint (no regex in the request): the live proposals and RFT
    of a grounded agent point only at outlined elements, bounded by the screenshot's own size."""
    import io

    import regex

    from sandbox.action_regex import grounded_regex, proposal_regex
    from training.policy.server import ChatRequest, PolicyEngine

    buffer = io.BytesIO()
    Image.new("RGB", (1288, 812), "gray").save(buffer, "JPEG")
    messages = build_messages("Click the button labelled 'Open'.", [], buffer.getvalue(), observation_text=OUTLINE)
    engine = PolicyEngine(agent, threads=1)
    request = ChatRequest(messages=messages, n=4, temperature=1.5, max_tokens=300, seed=1)
    assert engine.prepare(request).processors  # the grounding pattern, built from the last observation
    pattern = regex.compile(grounded_regex(OUTLINE, 1288, 812, instruction="Click the button labelled 'Open'."))
    choices = engine.complete(request)["choices"]
    assert len(choices) == 4 and all(pattern.fullmatch(c["message"]["content"]) for c in choices)
    # A caller's generic grammar (live proposals and RFT send one) gives way to the checkpoint's narrower rule.
    generic = {"regex": proposal_regex(1288, 812)}
    choices = engine.complete(request.model_copy(update={"structured_outputs": generic}))["choices"]
    assert all(pattern.fullmatch(c["message"]["content"]) for c in choices)
    desktop = build_messages("Close the window.", [], buffer.getvalue())
    assert not engine.prepare(ChatRequest(messages=desktop)).processors  # no outline: free, as any model
