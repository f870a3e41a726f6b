"""UI-TARS prompts in the OpenAI chat format: the computer-use system text, the history, the last screenshots."""

from __future__ import annotations

import base64
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


def image_part(jpeg: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()}}


def build_messages(
    instruction: str, history: list[Turn], screenshot_jpeg: bytes, *, keep_images: int = 5, language: str = "English"
) -> list[dict[str, Any]]:
    """The chat for the next step: only the last `keep_images` screenshots (current one included) are sent;
    older turns keep their thought and action text, as UI-TARS-1.5 was trained."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": COMPUTER_USE.format(language=language, instruction=instruction)}
    ]
    first_with_image = len(history) + 1 - max(1, keep_images)
    for n, turn in enumerate(history):
        if n >= first_with_image and turn.screenshot_jpeg:
            messages.append({"role": "user", "content": [image_part(turn.screenshot_jpeg)]})
        messages.append({"role": "assistant", "content": f"Thought: {turn.thought}\nAction: {turn.action_text}"})
    messages.append({"role": "user", "content": [image_part(screenshot_jpeg)]})
    return messages
