"""Playing suite tasks on the sandbox service: read a session's state for the oracle, and solve a task with it."""

from __future__ import annotations

import json
from typing import Any

from ..client import SandboxClient
from .apps import DesktopFamily
from .core import spec_of
from .page import PROBE


def read_state(client: SandboxClient, session_id: str, task: Any) -> dict[str, Any]:
    """What the oracle needs about the session now: the page's boxes and state, or the desktop's window and files."""
    fam, spec = spec_of(task)
    if isinstance(fam, DesktopFamily):
        result = client.shell(session_id, fam.probe(spec))
        if result.get("exit_code") != 0:
            raise RuntimeError(f"the desktop probe failed: {result.get('stderr', '')[:300]}")
        return json.loads(result["stdout"])
    return client.verify(session_id, PROBE)


def oracle_step(
    client: SandboxClient, session_id: str, task: Any, *, wrong: bool = False
) -> tuple[str, dict[str, Any]]:
    """Read the state, ask the oracle (or its `wrong` twin) for the next action and run it in screen pixels (waiting
    for the screen to settle, as a live step does); the action and the state it was chosen in."""
    fam, spec = spec_of(task)
    state = read_state(client, session_id, task)
    action = fam.wrong(spec, state) if wrong else fam.oracle(spec, state)
    if not action.startswith("finished("):
        client.step(session_id, action, coordinates="screen")
    return action, state


def solve(client: SandboxClient, session_id: str, task: Any, max_steps: int = 40) -> list[str]:
    """Play the oracle until it says finished(); the actions taken. The session must have run the task's setup."""
    actions: list[str] = []
    state: dict[str, Any] = {}
    for _ in range(max_steps):
        action, state = oracle_step(client, session_id, task)
        actions.append(action)
        if action.startswith("finished("):
            return actions
    raise RuntimeError(f"the oracle did not finish within {max_steps} steps: {actions[-3:]}; last state {state}")
