"""The suite agent: a small UI-TARS-shaped model (Qwen2.5-VL architecture) built from a config, untrained, sized to
learn the bundled task suite on a 2-core CPU. It sees a low-resolution screenshot and, on browser tasks, the page's
outline of interactive elements (sandbox/outline.py) that SandboxEnv puts in every observation; it answers
`Thought: … Action: …` through the policy server like any checkpoint. See docs/agent.md for the recipe and numbers.

    python -m training agent-init --out var/agent/init
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from training.policy.grounding import DECODING_KEY, GROUNDED, INSTRUCTION_HEADING
from training.policy.tiny import build_tiny_checkpoint

PATCH = 28  # a merged vision token covers 28x28 pixels

# The agent's chat template: Qwen2-VL's (training/policy/tiny.py), except that a message holding the computer-use
# prompt (training/policy/prompts.py COMPUTER_USE) keeps only its instruction, as "Task: …". The prompt's fixed text
# (output format, action space) is two thirds of a short episode's tokens; a model trained from scratch learns the
# grammar from its demonstrations instead, and trains about three times faster on a CPU without it. Every caller
# still sends the standard prompt: the template, part of the checkpoint, shortens it the same way in training and in
# serving.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}"
    "{% if '" + INSTRUCTION_HEADING.replace("\n", "\\n") + "' in message['content'] %}"
    "Task: {{ message['content'].split('" + INSTRUCTION_HEADING.replace("\n", "\\n") + "')[-1] | trim }}"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class AgentConfig:
    """The agent's size: decoder width, depth and heads, and the screenshot's size in vision tokens (the image
    processor resizes every screenshot to about `image_tokens` 28-pixel cells, keeping its aspect ratio)."""

    hidden: int = 64
    layers: int = 3
    heads: int = 2
    image_tokens: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden < 32 or self.layers < 1 or self.heads < 1:
            raise ValueError("hidden must be at least 32, layers and heads at least 1")
        if not 4 <= self.image_tokens <= 1024:
            raise ValueError("image_tokens must be between 4 and 1024")


def build_agent(path: str | Path, config: AgentConfig | None = None) -> Path:
    """Write the untrained agent to `path` (kept as it is if already built) with `agent.json` naming its config."""
    config = config or AgentConfig()
    pixels = config.image_tokens * PATCH * PATCH
    out = build_tiny_checkpoint(
        Path(path),
        seed=config.seed,
        hidden=config.hidden,
        layers=config.layers,
        heads=config.heads,
        min_pixels=pixels,
        max_pixels=pixels,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    # Grounded decoding (training/policy/grounding.py): the config travels with every checkpoint trained from this one.
    model_config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**model_config, DECODING_KEY: GROUNDED}, indent=2))
    (out / "agent.json").write_text(json.dumps({"agent": asdict(config), "trained": False}))
    return out
