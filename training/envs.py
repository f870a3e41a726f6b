"""Environments for multi-turn rollouts: small verifiable text tasks (tests, demos, benchmarks) and the sandbox
service's GUI sessions. An environment speaks chat messages: `reset` gives the opening messages, `step` takes the
policy's reply and answers with an observation message, a per-turn reward and whether the episode is over."""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandbox.actions import TERMINAL_ACTIONS, ActionSyntaxError, format_actions, parse_step
from sandbox.client import ActionError, NoCapacityError, SandboxClient, SandboxError
from sandbox.outline import render as render_outline


@dataclass
class Feedback:
    """What the environment answers to one reply."""

    observation: dict[str, Any] | None  # the next user message, None when the episode is over
    reward: float
    done: bool
    info: dict[str, Any]


class Env(Protocol):
    name: str

    def reset(self, seed: int) -> list[dict[str, Any]]: ...

    def expert(self) -> str: ...

    def step(self, reply: str) -> Feedback: ...

    def close(self) -> None: ...


class CopyEnv:
    """Each turn shows a short code of letters; the reply must repeat it exactly. Reward 1/turns per exact copy, so
    the episode return is the fraction copied. Verifiable, multi-turn, learnable by a tiny model in minutes.

    turns: a fixed count, or drawn per episode from a long-tailed (log-normal) law when `tail` > 0, which with
    `latency_s` (time the environment takes per step, as a sandbox does) models GUI episodes for the benchmarks."""

    name = "copy"

    def __init__(
        self,
        *,
        turns: int = 3,
        length: int = 1,
        alphabet: str = "abcd",
        tail: float = 0.0,
        max_turns: int = 64,
        latency_s: float = 0.0,
    ):
        self.turns, self.length, self.alphabet = turns, length, alphabet
        self.tail, self.max_turns, self.latency_s = tail, max_turns, latency_s
        self._rng = random.Random(0)
        self._code = ""
        self._left = 0
        self._episode_turns = turns

    def _new_code(self) -> str:
        return "".join(self._rng.choice(self.alphabet) for _ in range(self.length))

    def reset(self, seed: int) -> list[dict[str, Any]]:
        self._rng = random.Random(seed)
        turns = self.turns
        if self.tail > 0:
            turns = min(self.max_turns, max(1, round(self.turns * self._rng.lognormvariate(0.0, self.tail))))
        self._episode_turns = self._left = turns
        self._code = self._new_code()
        return [
            {"role": "system", "content": "Repeat each code exactly."},
            {"role": "user", "content": self._code},
        ]

    def expert(self) -> str:
        """The correct reply now (for demonstrations)."""
        return self._code

    def step(self, reply: str) -> Feedback:
        if self.latency_s:
            time.sleep(self.latency_s)
        correct = reply.strip() == self._code
        self._left -= 1
        reward = (1.0 if correct else 0.0) / self._episode_turns
        if self._left <= 0:
            return Feedback(None, reward, True, {"correct": correct})
        self._code = self._new_code()
        return Feedback({"role": "user", "content": self._code}, reward, False, {"correct": correct})

    def close(self) -> None:
        pass


class GuessEnv:
    """Guess a number in [1, high] from 'higher'/'lower' hints within `tries` turns: reward 1 when found. The
    observation carries information the next turn needs, and episode lengths vary with the policy."""

    name = "guess"

    def __init__(self, *, high: int = 8, tries: int = 4, latency_s: float = 0.0):
        self.high, self.tries, self.latency_s = high, tries, latency_s
        self._target = 0
        self._left = 0
        self._low, self._high = 1, high

    def reset(self, seed: int) -> list[dict[str, Any]]:
        self._target = random.Random(seed).randint(1, self.high)
        self._left = self.tries
        self._low, self._high = 1, self.high
        return [
            {"role": "system", "content": f"Guess the number from 1 to {self.high}. Answer with the number only."},
            {"role": "user", "content": "guess"},
        ]

    def expert(self) -> str:
        """Binary search over what the hints leave open."""
        return str((self._low + self._high) // 2)

    def step(self, reply: str) -> Feedback:
        if self.latency_s:
            time.sleep(self.latency_s)
        self._left -= 1
        match = re.fullmatch(r"\s*(\d+)\s*", reply)
        if match and int(match.group(1)) == self._target:
            return Feedback(None, 1.0, True, {"found": True})
        if self._left <= 0:
            return Feedback(None, 0.0, True, {"found": False})
        hint = "invalid" if not match else ("higher" if int(match.group(1)) < self._target else "lower")
        if hint == "higher":
            self._low = max(self._low, int(match.group(1)) + 1)  # type: ignore[union-attr]
        elif hint == "lower":
            self._high = min(self._high, int(match.group(1)) - 1)  # type: ignore[union-attr]
        return Feedback({"role": "user", "content": hint}, 0.0, False, {"found": False})

    def close(self) -> None:
        pass


class SandboxEnv:
    """An OSWorld-style task on a sandbox desktop: the task's `config` runs at reset, each reply is a UI-TARS
    "Thought: … Action: …" step executed by the sandbox service, the observation is the new screenshot (saved under
    `image_dir`, referenced by relative path as the episode format wants). `finished()`, `call_user()` and `fail()`
    end the episode and the task's evaluator scores it, told the last action: OSWorld's infeasible tasks score 1
    only for `fail()`, and `fail()` scores 0 on any other task. Out of steps (`max_steps`), the final state is scored
    too (as OSWorld's runner does), with no last action and `truncated` in the info. An evaluator that can't run
    scores 0 and its error is recorded in the turn's info (`evaluator_error`), so one bad task never ends a rollout
    batch; the info's `score` is the evaluator's alone.
    A reply that does not parse, or whose action the sandbox refuses, costs `format_penalty` and leaves the screen
    as it was. A task whose `platform` is "browser" gets a browser session; there, with `outline` (the default), each
    observation also carries the page's outline of interactive elements as text (sandbox/outline.py, docs/agent.md)."""

    name = "sandbox"

    def __init__(
        self,
        client: Any,
        task: dict[str, Any],
        image_dir: Path,
        *,
        max_steps: int = 15,
        format_penalty: float = -0.1,
        ttl_s: float = 600,
        outline: bool = True,
    ):
        from training.policy.prompts import COMPUTER_USE

        self.client, self.task, self.image_dir = client, task, Path(image_dir)
        self.max_steps, self.format_penalty, self.ttl_s = max_steps, format_penalty, ttl_s
        self.outline = outline
        self._scale: tuple[float, float] | None = None  # screen → model frame, for a browser session's outline
        self.system = COMPUTER_USE.format(language="English", instruction=task["instruction"])
        self.session: str | None = None
        self._kind = ""  # the held session's kind: "browser" or "desktop"
        self._steps = 0
        self._prefix = ""

    def _observation(self, jpeg: bytes) -> dict[str, Any]:
        self.image_dir.mkdir(parents=True, exist_ok=True)
        name = f"{self._prefix}-{self._steps:03d}.jpg"
        (self.image_dir / name).write_bytes(jpeg)
        content: list[dict[str, Any]] = [{"type": "image", "image": f"{self.image_dir.name}/{name}"}]
        if self._scale is not None and self.session is not None:
            content.append({"type": "text", "text": self._outline_text(self.session, self._scale)})
        return {"role": "user", "content": content}

    def _outline_text(self, session: str, scale: tuple[float, float]) -> str:
        """The page's outline in the model's frame; a page that cannot be read (navigated away) says so."""
        try:
            return render_outline(self.client.outline(session), scale)
        except (SandboxError, ValueError):
            return "Interactive elements: unavailable."

    def _lease(self) -> str:
        """Allocate the session the task wants (a browser for browser tasks) and note its frame for the outline."""
        browser = self.task.get("platform") == "browser"
        self._kind = "browser" if browser else "desktop"
        info = self.client.allocate(ttl_s=self.ttl_s, kind=self._kind)
        self._scale = None
        if browser and self.outline and hasattr(self.client, "outline") and "model_width" in info:
            self._scale = (info["model_width"] / info["screen_width"], info["model_height"] / info["screen_height"])
        return str(info["session_id"])

    def reset(self, seed: int) -> list[dict[str, Any]]:
        self.close()
        self.session = self._lease()
        self.client.setup(self.session, self.task.get("config", []))
        self._steps = 0
        self._prefix = f"{self.task.get('id', 'task')}-{seed}"
        return [{"role": "user", "content": self.system}, self._observation(self.client.observe(self.session))]

    def step(self, reply: str) -> Feedback:
        assert self.session is not None, "reset() first"
        self._steps += 1
        try:
            actions = parse_step(reply).actions
        except ActionSyntaxError as exc:
            return self._refused(str(exc))
        end = next((n for n, a in enumerate(actions) if a.name in TERMINAL_ACTIONS), None)
        if end is None and self._steps >= self.max_steps:
            return self._finish(None)
        run = actions if end is None else actions[:end]  # what comes before the episode's end still happens
        try:
            result = self.client.step(self.session, format_actions(run), observe=end is None) if run else None
        except ActionError as exc:
            return self._refused(str(exc))
        if end is None:
            return Feedback(self._observation(result.observation_jpeg), 0.0, False, {"steps": self._steps})
        return self._finish(actions[end].name)

    def _refused(self, error: str) -> Feedback:
        """A reply that did not parse or run: the format penalty, and the same screen again."""
        if self._steps >= self.max_steps:  # out of steps: the final state is still scored, as OSWorld does
            ended = self._finish(None)
            ended.reward += self.format_penalty
            ended.info["error"] = error
            return ended
        observation = self._observation(self.client.observe(self.session))
        return Feedback(observation, self.format_penalty, False, {"error": error})

    def _finish(self, last_action: str | None) -> Feedback:
        """The episode ends with `last_action` (None: out of steps, `truncated`): the evaluator scores the final
        state, as OSWorld's runner does after its step limit too; an evaluator error is recorded, scoring 0. The
        score is also in the info (`score`), apart from any format penalty of that turn."""
        info: dict[str, Any] = {"steps": self._steps, "last_action": last_action}
        if last_action is None:
            info["truncated"] = True
        evaluator = self.task.get("evaluator")
        try:
            if not evaluator:
                raise ValueError(f"task {self.task.get('id', '?')!r} has no evaluator")
            score = float(self.client.evaluate(self.session, evaluator, last_action=last_action))
        except (SandboxError, ValueError) as exc:
            score, info["evaluator_error"] = 0.0, str(exc)
        info["score"] = score
        return Feedback(None, score, True, info)

    def close(self) -> None:
        if self.session is not None:
            self.client.release(self.session)
            self.session = None


class SandboxTaskEnv(SandboxEnv):
    """`SandboxEnv` over a list of tasks: seed n plays task n mod len(tasks). A desktop session is released as soon
    as its episode ends; a browser session is kept, with `reuse` (the default), and reset for the next browser task
    (`SandboxClient.reset`: a blank page, site data cleared), which saves starting a Chromium per episode. `close()`,
    from any thread (a trainer stopping, Ctrl-C), releases the session held and refuses any later `reset`, so no
    lease outlives the run. Owns its sandbox client."""

    def __init__(self, client: Any, tasks: list[dict[str, Any]], image_dir: Path, *, capacity_wait_s: float = 300,
                 reuse: bool = True, **options: Any):  # fmt: skip
        if not tasks:
            raise ValueError("no sandbox tasks to play")
        super().__init__(client, tasks[0], image_dir, **options)
        self.capacity_wait_s = capacity_wait_s
        self.reuse = reuse
        self.tasks = tasks
        self.meta: dict[str, Any] = {}
        self.leased = 0  # sessions allocated so far (the rest of the episodes reused one)
        self._lock = threading.Lock()
        self._closed = False

    def reset(self, seed: int) -> list[dict[str, Any]]:
        from training.policy.prompts import COMPUTER_USE

        self.task = self.tasks[seed % len(self.tasks)]
        self.system = COMPUTER_USE.format(language="English", instruction=self.task["instruction"])
        self.meta = {"task_id": self.task["id"], "base_dir": str(self.image_dir.parent)}
        if not self._reused():
            self.release()
            self._allocate()
        self.client.setup(self.session, self.task.get("config", []))
        self._steps = 0
        self._prefix = f"{_file_safe(self.task['id'])}-{seed}"
        return [{"role": "user", "content": self.system}, self._observation(self.client.observe(self.session))]

    def _allocate(self) -> None:
        """Lease a new session, waiting (up to `capacity_wait_s`) while the service is full; never after `close()`
        (the lock makes a concurrent `close` see the new session and give it back)."""
        deadline = time.monotonic() + self.capacity_wait_s
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the sandbox environment is closed")
                try:
                    self.session = self._lease()
                    self.leased += 1
                    return
                except NoCapacityError:
                    if time.monotonic() >= deadline:
                        raise
            time.sleep(1.0)

    def step(self, reply: str) -> Feedback:
        if self.session is None:
            raise RuntimeError("the sandbox session was released (the environment is closing)")
        feedback = super().step(reply)
        if feedback.done and not self._keeps_session():
            self.release()
        return feedback

    def _keeps_session(self) -> bool:
        return self.reuse and self._kind == "browser"

    def _reused(self) -> bool:
        """Whether the session held was made fresh for `self.task` (a browser task on a browser session kept from
        the last episode); False leaves the caller to allocate one. A session that cannot be reset is let go."""
        if self.session is None or not self._keeps_session() or self.task.get("platform") != "browser":
            return False
        try:
            self.client.reset(self.session, self.ttl_s)
        except SandboxError:  # lost or expired meanwhile: a new one will do
            self.release()
            return False
        return True

    def release(self) -> None:
        """Give the current session back, if any (idempotent, thread-safe)."""
        with self._lock:
            session, self.session = self.session, None
        if session is not None:
            try:
                self.client.release(session)
            except SandboxError:  # already gone (expired or reclaimed): nothing left to give back
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.release()
        self.client.close()


def _file_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text))[:80] or "task"


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """OSWorld-format tasks (`id`, `instruction`, `config`, `evaluator`) from a JSON list, a JSON object with a
    `tasks` list, or JSON Lines; the platform's own field names (`external_id`, `setup_config`) are accepted too.
    A bad file or record raises ValueError naming it, before any session is leased."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the task file {path}: {exc.strerror or exc}") from None
    records: Any
    try:
        whole = json.loads(text.lstrip("\ufeff"))
        records = whole.get("tasks", [whole]) if isinstance(whole, dict) else whole
    except json.JSONDecodeError:  # JSON Lines
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
    if not isinstance(records, list) or not records:
        raise ValueError(f"{path}: no tasks in the file")
    return [_task(record, f"{path}: task {n}") for n, record in enumerate(records)]


def _task(record: Any, where: str) -> dict[str, Any]:
    """One task in OSWorld's field names, checked."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a task is a JSON object")
    task_id = record.get("id", record.get("external_id"))
    if task_id in (None, ""):
        raise ValueError(f"{where}: 'id' is missing")
    instruction = record.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError(f"{where} ({task_id}): 'instruction' must be a non-empty string")
    config = record.get("config", record.get("setup_config", []))
    if not isinstance(config, list):
        raise ValueError(f"{where} ({task_id}): 'config' must be a list of setup steps")
    evaluator = record.get("evaluator")
    if not isinstance(evaluator, dict) or not evaluator:
        raise ValueError(f"{where} ({task_id}): 'evaluator' must be an OSWorld evaluator object (a verifiable task)")
    return {**record, "id": str(task_id), "instruction": instruction, "config": config, "evaluator": evaluator}


@dataclass
class SandboxSettings:
    """Where a sandbox environment's sessions come from and what it plays."""

    tasks: list[dict[str, Any]]
    url: str
    api_key: str
    image_dir: Path
    owner: str = "trainer"


def sandbox_url(url: str = "") -> str:
    """The sandbox service to use: `url`, else $SANDBOX_URL, else the local default."""
    return url or os.environ.get("SANDBOX_URL") or "http://127.0.0.1:8010"


def sandbox_api_key(key: str = "") -> str:
    """The sandbox service's API key: `key`, else $SANDBOX_API_KEY."""
    return key or os.environ.get("SANDBOX_API_KEY", "")


def make_sandbox_env(spec: str, settings: SandboxSettings) -> SandboxTaskEnv:
    """A sandbox environment from a spec such as "sandbox" or "sandbox:max_steps=8,format_penalty=-0.1" (options:
    max_steps, format_penalty, ttl_s of a session's lease, capacity_wait_s for a free session, outline=0|1 for the
    page outline in browser tasks' observations, reuse=0|1 for keeping a browser session from one episode to the
    next)."""
    kwargs = sandbox_options(spec)
    client = SandboxClient(settings.url, settings.api_key, owner=settings.owner)
    return SandboxTaskEnv(client, settings.tasks, settings.image_dir, **kwargs)


def sandbox_options(spec: str) -> dict[str, Any]:
    """The options of a sandbox spec, checked (ValueError naming a bad one)."""
    name, _, options = spec.partition(":")
    if name != "sandbox":
        raise ValueError(f"not a sandbox environment spec: {spec!r}")
    known = {"max_steps": int, "format_penalty": float, "ttl_s": float, "capacity_wait_s": float, "outline": boolean,
             "reuse": boolean}  # fmt: skip
    return _options(options, known)


def boolean(value: str) -> bool:
    """A boolean option: 1/0, true/false, yes/no."""
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no"):
        return False
    raise ValueError(value)


def _options(text: str, known: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in known:
            raise ValueError(f"unknown sandbox option {key!r} (known: {', '.join(known)})")
        try:
            out[key] = known[key](value)
        except ValueError:
            raise ValueError(f"sandbox option {key} must be a {known[key].__name__}, not {value!r}") from None
    return out


def is_sandbox(spec: str) -> bool:
    return spec.partition(":")[0] == "sandbox"


TEXT_ENVS = {"copy": CopyEnv, "guess": GuessEnv}


def make_text_env(spec: str) -> Env:
    """An environment from a spec such as "copy", "copy:turns=3,length=2" or "guess:high=16"."""
    name, _, options = spec.partition(":")
    if name not in TEXT_ENVS:
        raise ValueError(f"unknown environment {name!r} (known: {', '.join(TEXT_ENVS)})")
    kwargs: dict[str, Any] = {}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = value if key == "alphabet" else (float(value) if "." in value else int(value))
    return TEXT_ENVS[name](**kwargs)
