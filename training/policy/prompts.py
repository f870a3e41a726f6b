"""UI-TARS prompts in the OpenAI chat format: the computer-use system text, the history, the last screenshots; and
the generative outcome reward model's prompt (UI-TARS-2 §2.5) with the strict parser of its answer."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

# UI-TARS-1.5's computer-use prompt (bytedance/UI-TARS codes/ui_tars/prompt.py), box notation.
COMPUTER_USE = r"""You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space
click(start_box='<|box_start|>(x1,y1)<|box_end|>')
left_double(start_box='<|box_start|>(x1,y1)<|box_end|>')
right_single(start_box='<|box_start|>(x1,y1)<|box_end|>')
drag(start_box='<|box_start|>(x1,y1)<|box_end|>', end_box='<|box_start|>(x3,y3)<|box_end|>')
hotkey(key='ctrl c') # Split keys with a space and use lowercase. Also, do not use more than 3 keys in one hotkey action.
type(content='xxx') # Use escape characters \', \", and \n in content part to ensure we can parse the content in normal python string format. If you want to submit your input, use \n at the end of content.
scroll(start_box='<|box_start|>(x1,y1)<|box_end|>', direction='down or up or right or left') # Show more information on the `direction` side.
wait() # Sleep for 5s and take a screenshot to check for any changes.
finished(content='xxx') # Use escape characters \', \", and \n in content part to ensure we can parse the content in normal python string format.

## Note
- Use {language} in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part.

## User Instruction
{instruction}
"""


@dataclass(frozen=True)
class Turn:
    """One earlier step as the model should remember it: the screenshot it saw and what was done."""

    screenshot_jpeg: bytes | None
    thought: str
    action_text: str


def image_part(image: bytes, mime: str = "image/jpeg") -> dict[str, Any]:
    """An OpenAI image content part: the bytes as a data URL (no network on either side)."""
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64," + base64.b64encode(image).decode()}}


def build_messages(
    instruction: str,
    history: list[Turn],
    screenshot_jpeg: bytes,
    *,
    keep_images: int = 5,
    language: str = "English",
    observation_text: str | None = None,
) -> list[dict[str, Any]]:
    """The chat for the next step: only the last `keep_images` screenshots (current one included) are sent;
    older turns keep their thought and action text, as UI-TARS-1.5 was trained. `observation_text` (a browser
    page's outline of interactive elements, sandbox/outline.py) follows the current screenshot when given, as the
    trainer's SandboxEnv observations carry it, so a model trained on them is prompted the same way."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": COMPUTER_USE.format(language=language, instruction=instruction)}
    ]
    first_with_image = len(history) + 1 - max(1, keep_images)
    for n, turn in enumerate(history):
        if n >= first_with_image and turn.screenshot_jpeg:
            messages.append({"role": "user", "content": [image_part(turn.screenshot_jpeg)]})
        messages.append({"role": "assistant", "content": f"Thought: {turn.thought}\nAction: {turn.action_text}"})
    current: list[dict[str, Any]] = [image_part(screenshot_jpeg)]
    if observation_text is not None:
        current.append({"type": "text", "text": observation_text})
    messages.append({"role": "user", "content": current})
    return messages


# --- the generative outcome reward model (ORM) -----------------------------------------------------------------------

ORM_KEEP_IMAGES = 5  # the report's ORM sees the full text history and the last five screenshots

# The judge's task. Its answer must END with a line `Score: <number from 0 to 1>`; anything else is unparseable.
OUTCOME_REWARD = r"""You are judging whether a GUI agent completed a task. You are given the task, every step the agent took (its thought and its action), and the screenshots of its last steps; each screenshot shows the screen before that step's action.

## Task
{instruction}

## Output Format
Explain your judgement in a few sentences, then end your answer with exactly one line:
Score: <a number from 0 to 1>
where 1 means the task was certainly completed and 0 means it certainly was not. Write nothing after that line.
"""

ORM_SCORE = r"(?:0(?:\.[0-9]{1,6})?|1(?:\.0{1,6})?|\.[0-9]{1,6})"
# The last non-empty line, whole: `Score: 0.8` (one space or none after the colon; surrounding spaces tolerated).
_SCORE_LINE = re.compile(rf"[ \t]*Score:[ ]?({ORM_SCORE})[ \t]*")
# For grammar-constrained decoding (vLLM structured_outputs, the embedded server): a short reason, then the score.
ORM_ANSWER_REGEX = rf"[^\n]{{0,200}}\nScore: {ORM_SCORE}"


def build_orm_messages(
    instruction: str, history: list[Turn], *, keep_images: int = ORM_KEEP_IMAGES
) -> list[dict[str, Any]]:
    """One user message for the judge: the prompt, then every step's thought and action as text, each of the last
    `keep_images` steps preceded by its screenshot (older steps are text only), then the request for the score."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": OUTCOME_REWARD.format(instruction=instruction)}]
    parts.append({"type": "text", "text": f"## The agent's {len(history)} steps\n"})
    first_with_image = len(history) - max(0, keep_images)
    for n, turn in enumerate(history):
        if n >= first_with_image and turn.screenshot_jpeg:
            parts.append(image_part(turn.screenshot_jpeg, image_mime(turn.screenshot_jpeg)))
        parts.append({"type": "text", "text": f"Step {n + 1}\nThought: {turn.thought}\nAction: {turn.action_text}\n"})
    parts.append({"type": "text", "text": "Did the agent complete the task? End with the line `Score: <0 to 1>`."})
    return [{"role": "user", "content": parts}]


def image_mime(data: bytes) -> str:
    """The MIME type of a stored screenshot from its first bytes (PNG, WebP or JPEG, the default)."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/jpeg"


@dataclass(frozen=True)
class OrmAnswer:
    """The judge's answer read strictly: `score` in [0, 1], or None with `problem` saying why it is unparseable."""

    score: float | None
    problem: str = ""


def parse_orm_answer(text: str) -> OrmAnswer:
    """Read the score from the answer's last non-empty line, which must be `Score: <0..1>` and nothing else; any
    other answer (empty, no such line, a number out of range, text after it) has no score, never a pass."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return OrmAnswer(None, "the answer is empty")
    match = _SCORE_LINE.fullmatch(lines[-1])
    if match is None:
        return OrmAnswer(None, "its last line is not `Score: <a number from 0 to 1>`")
    return OrmAnswer(float(match.group(1)))
