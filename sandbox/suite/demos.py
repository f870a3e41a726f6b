"""Oracle demonstrations of suite tasks as SFT-ready episodes: the oracle plays each task on the sandbox service and
every step is written as the agent will see it (the screenshot in the model's frame, the page's outline as text, the
UI-TARS reply in model coordinates), in the trainer's episode format (training/data.py), so `python -m training sft`
reads the file as it is. Only episodes that the task's own evaluator scores 1 are kept. No Django.

    from sandbox.suite.demos import record_demos
    result = record_demos(client, suite_tasks(["click-button"], train=50, heldout=0), Path("var/demos/sft.jsonl"))
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The prompt the agent is served with, so episodes open exactly as SandboxEnv's do (plain Python: no torch, no Django).
from training.policy.prompts import COMPUTER_USE

from ..actions import Action, format_actions, parse_actions
from ..client import SandboxClient, SandboxError
from ..coordinates import ScreenMapping, map_points, mapping_for
from ..outline import Element, element_at, line, render
from .core import spec_of
from .run import read_state

DEMO_SOURCE = "demonstration"


@dataclass
class DemoResult:
    """What `record_demos` wrote: episodes kept, steps in them, tasks that failed (id and why), wall seconds."""

    path: str
    episodes: int = 0
    steps: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def thought_for(action: Action, elements: list[Element], scale: tuple[float, float]) -> str:
    """A short plan naming the target, written from what the agent sees (the outline), never from the oracle's state:
    the element under a click, the text typed, the keys, the direction."""
    name = action.name
    if name == "finished":
        return "The task is done."
    if name == "type":
        return f"I type {json.dumps(getattr(action, 'content', ''), ensure_ascii=False)}."
    if name == "hotkey":
        return f"I press {' '.join(getattr(action, 'keys', ()))}."
    if name == "scroll":
        return f"I scroll {getattr(action, 'direction', 'down')} to see more."
    point = getattr(action, "point", None) or getattr(action, "start", None)
    target = element_at(elements, point.x, point.y, scale) if point is not None else None
    # The element's own outline line (role, label, state, centre): the action's point is read off it.
    what = line(target, scale) if target is not None else "the target"
    verb = {"left_double": "double-click", "drag": "drag", "right_single": "right-click"}.get(name, "click")
    return f"I {verb} {what}."


def _to_model(action_text: str, mapping: ScreenMapping, elements: list[Element]) -> list[Action]:
    """The oracle's actions in the model's frame; a click on an outlined element goes to the centre its outline line
    shows (the same element, so the same effect), which a model can copy."""
    scale = (mapping.model_size[0] / mapping.screen_width, mapping.model_size[1] / mapping.screen_height)

    def to_model(x: float, y: float) -> tuple[int, int]:
        target = element_at(elements, x, y)
        return target.centre(scale) if target is not None else mapping.to_model(x, y)

    clicks = ("click", "left_double", "right_single")
    return [map_points([a], to_model if a.name in clicks else mapping.to_model)[0] for a in parse_actions(action_text)]


def demonstration_turn(action_text: str, mapping: ScreenMapping, elements: list[Element]) -> tuple[str, str]:
    """The oracle's screen-pixel action as the agent's demonstrations write it: (thought, model-frame action text),
    a click on an outlined element sent to the centre its line shows and named by that line."""
    scale = (mapping.model_size[0] / mapping.screen_width, mapping.model_size[1] / mapping.screen_height)
    actions = _to_model(action_text, mapping, elements)
    return thought_for(actions[0], elements, scale if elements else (1.0, 1.0)), format_actions(actions)


def _observation(image: str, text: str | None) -> dict[str, Any]:
    """A user message as SandboxEnv writes it: the screenshot, then the outline when the session has one."""
    content: list[dict[str, Any]] = [{"type": "image", "image": image}]
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}


def record_episode(
    client: SandboxClient,
    task: dict[str, Any],
    image_dir: Path,
    *,
    outline: bool = True,
    max_steps: int = 15,
    ttl_s: float = 300,
) -> dict[str, Any]:
    """Play one suite task with the oracle and return the episode (a dict in the trainer's format, reward 1), its
    screenshots written under `image_dir` and named relative to its parent; RuntimeError when it fails."""
    fam, _ = spec_of(task)
    browser = task.get("platform") == "browser"
    info = client.allocate(ttl_s=ttl_s, kind="browser" if browser else "desktop")
    session = info["session_id"]
    mapping = mapping_for(info["screen_width"], info["screen_height"], info["model_width"], info["model_height"])
    scale = (info["model_width"] / info["screen_width"], info["model_height"] / info["screen_height"])
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(task["id"]))[:80]
    image_dir.mkdir(parents=True, exist_ok=True)
    use_outline = outline and browser

    def observe(n: int, jpeg: bytes) -> tuple[dict[str, Any], list[Element]]:
        name = f"{prefix}-{n:03d}.jpg"
        (image_dir / name).write_bytes(jpeg)
        elements = client.outline(session) if use_outline else []
        text = render(elements, scale) if use_outline else None
        return _observation(f"{image_dir.name}/{name}", text), elements

    try:
        client.setup(session, task.get("config", []))
        first, elements = observe(0, client.observe(session))
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": COMPUTER_USE.format(language="English", instruction=task["instruction"])},
            first,
        ]
        for n in range(1, max_steps + 1):
            action_text = fam.oracle(spec_of(task)[1], read_state(client, session, task))
            actions = _to_model(action_text, mapping, elements)
            thought = thought_for(actions[0], elements, (1.0, 1.0) if not use_outline else scale)
            messages.append({"role": "assistant", "content": f"Thought: {thought}\nAction: {format_actions(actions)}"})
            if actions[-1].name == "finished":
                score = client.evaluate(session, task["evaluator"], last_action="finished")
                if score < 1.0:
                    raise RuntimeError(f"the oracle finished but the evaluator scored {score}")
                return {
                    "id": f"demo-{task['id']}",
                    "source": DEMO_SOURCE,
                    "instruction": task["instruction"],
                    "reward": 1.0,
                    "messages": messages,
                    "meta": {"task_id": task["id"], **task.get("metadata", {})},
                }
            result = client.step(session, action_text, coordinates="screen", observe=True)
            observation, elements = observe(n, result.observation_jpeg or client.observe(session))
            messages.append(observation)
        raise RuntimeError(f"the oracle did not finish within {max_steps} steps")
    finally:
        try:
            client.release(session)
        except SandboxError:
            pass


def record_demos(
    client: SandboxClient,
    tasks: list[dict[str, Any]],
    out: Path,
    *,
    outline: bool = True,
    max_steps: int = 15,
    on_episode: Callable[[int, int], None] | None = None,
) -> DemoResult:
    """Write one oracle demonstration per suite task to `out` (JSON Lines; screenshots in `<out stem>-images/` beside
    it); tasks the oracle fails are skipped and listed. `on_episode(done, total)` reports progress."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    image_dir = out.parent / f"{out.name.split('.')[0]}-images"
    result = DemoResult(path=str(out))
    started = time.monotonic()
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "w", encoding="utf-8") as handle:
        for n, task in enumerate(tasks, start=1):
            try:
                episode = record_episode(client, task, image_dir, outline=outline, max_steps=max_steps)
            except (RuntimeError, SandboxError, ValueError) as exc:
                result.failed.append((str(task.get("id")), str(exc)[:300]))
            else:
                handle.write(json.dumps(episode, ensure_ascii=False) + "\n")
                result.episodes += 1
                result.steps += sum(1 for m in episode["messages"] if m["role"] == "assistant")
            if on_episode is not None:
                on_episode(n, len(tasks))
    tmp.replace(out)
    result.seconds = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    """`python -m sandbox.suite.demos --out FILE [--families a,b] [--train N] [--levels 1,2]`: record training
    instances' demonstrations on the service at $SANDBOX_URL (key $SANDBOX_API_KEY)."""
    import argparse
    import os

    from . import families, suite_tasks

    parser = argparse.ArgumentParser(prog="python -m sandbox.suite.demos", description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", default="", help="comma-separated (default: every browser family)")
    parser.add_argument("--train", type=int, default=20, help="training seeds per family and level")
    parser.add_argument("--levels", default="1", help="comma-separated difficulty levels")
    parser.add_argument("--no-outline", action="store_true", help="screenshots only")
    args = parser.parse_args(argv)
    names = [n for n in args.families.split(",") if n] or families()
    try:
        levels = [int(n) for n in args.levels.split(",") if n]
        tasks = suite_tasks(names, train=args.train, heldout=0, levels=levels)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    if not args.families:
        tasks = [t for t in tasks if t["platform"] == "browser"]
    url, key = os.environ.get("SANDBOX_URL", "http://127.0.0.1:8010"), os.environ.get("SANDBOX_API_KEY", "")
    client = SandboxClient(url, key, owner="suite-demos")
    try:
        result = record_demos(client, tasks, args.out, outline=not args.no_outline,
                              on_episode=lambda done, total: print(f"{done}/{total}", flush=True))  # fmt: skip
    finally:
        client.close()
    print(json.dumps({"path": result.path, "episodes": result.episodes, "steps": result.steps,
                      "failed": result.failed, "seconds": round(result.seconds, 1)}))  # fmt: skip
    return 0 if result.episodes else 1


if __name__ == "__main__":
    raise SystemExit(main())
