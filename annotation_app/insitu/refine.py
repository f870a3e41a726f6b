"""Optional refinement: the policy model rewrites think-aloud fragments ("uh, the save… no, the menu") into coherent
first-person reasoning for the step's action. The raw transcript is always kept beside the refined text."""

from __future__ import annotations

from typing import Any

from training.policy.client import PolicyClient

SYSTEM = (
    "You turn a computer user's spoken think-aloud fragments into the reasoning of one step of a GUI agent. "
    "Write one to three first-person sentences explaining why the action is taken next. Keep every fact the user "
    "said, drop fillers and false starts, invent nothing. Answer with the reasoning only."
)


def refine_request(model: str, instruction: str, raw: str, action_text: str, max_tokens: int = 160) -> dict[str, Any]:
    """The chat-completions body for one step (temperature 0: the same capture refines the same way)."""
    user = f"Task: {instruction}\nSpoken: {raw or '(nothing said)'}\nAction taken: {action_text}"
    return {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }


def refine_thought(client: PolicyClient, instruction: str, raw: str, action_text: str) -> str:
    """The refined reasoning for one step; raises PolicyError when the server fails, the raw text stays untouched."""
    reply = client.complete(refine_request(client.model, instruction, raw, action_text))
    text = (reply.get("choices") or [{}])[0].get("message", {}).get("content") or ""
    for label in ("Thought:", "Reasoning:"):
        text = text.removeprefix(label)
    return " ".join(text.split())
