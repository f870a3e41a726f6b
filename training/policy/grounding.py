"""Grounded decoding for models that ask for it in their config (`action_decoding: "grounded"`, the suite agent's):
when the newest observation carries a page outline (sandbox/outline.py), the reply may point only at an element it
lists, named by its line, and may type a string the instruction quotes (sandbox.action_regex.grounded_regex). The
embedded policy server and the trainer's in-process policy both apply it, so serving, evaluation and PPO sample the
same way; vLLM takes the same regex as `structured_outputs` from a client that builds it here."""

from __future__ import annotations

from typing import Any

from sandbox.action_regex import grounded_regex

DECODING_KEY = "action_decoding"  # in the checkpoint's config.json
GROUNDED = "grounded"
OUTLINE_HEADING = "Interactive elements"
INSTRUCTION_HEADING = "## User Instruction\n"  # training/policy/prompts.py COMPUTER_USE


def is_grounded(config: Any) -> bool:
    """Whether a model config (transformers' or its dict) asks for grounded decoding."""
    value = config.get(DECODING_KEY) if isinstance(config, dict) else getattr(config, DECODING_KEY, None)
    return value == GROUNDED


def observation_outline(messages: list[dict[str, Any]]) -> str | None:
    """The page outline that the newest user message carries, if any (a text part after its screenshot)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return None
        for part in content:
            if part.get("type") == "text" and str(part.get("text", "")).startswith(OUTLINE_HEADING):
                return str(part["text"])
        return None
    return None


def task_instruction(messages: list[dict[str, Any]]) -> str:
    """The task's instruction: the first user message's text (after the computer-use prompt's heading, if any)."""
    for message in messages:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [
            str(p.get("text", "")) for p in content or [] if p.get("type") == "text"
            and not str(p.get("text", "")).startswith(OUTLINE_HEADING)
        ]  # fmt: skip
        text = "\n".join(parts)
        return text.split(INSTRUCTION_HEADING)[-1].strip()
    return ""


def grounding_pattern(messages: list[dict[str, Any]], width: int, height: int) -> str | None:
    """The regex a grounded model's next reply must match, or None when the observation has no outline (a desktop
    screenshot): the reply is then free. Typed text may also copy a string the instruction quotes."""
    outline = observation_outline(messages)
    if outline is None:
        return None
    return grounded_regex(outline, width, height, instruction=task_instruction(messages))
