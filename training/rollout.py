"""Multi-turn rollouts: the agent loop (policy ⇄ environment), the policies it can talk to, and the streaming pool.

Policies answer `generate(conversations) -> (replies, version)`:
- `LocalPolicy` runs a transformers model in-process; requests from many episode threads are gathered into one
  batched `generate` call (a small continuous batcher), so the pool's concurrency becomes batch size.
- `RemotePolicy` speaks OpenAI chat completions (vLLM in production, or the embedded policy server) and records each
  turn's generated token ids and their log-probs as the server computed them while sampling (`logprobs`,
  `token_ids` on the assistant message), so no second forward pass is needed to know the behaviour policy.

`RolloutPool` keeps `concurrency` episodes running: the trainer takes a batch as soon as enough are finished while the
rest go on (UI-TARS-2's streaming updates, 2.5.2). Every assistant turn carries the policy version that wrote it, and a
staleness bound (AReaL's rule) stops new episodes from starting more than `max_staleness` versions ahead.
"""

from __future__ import annotations

import base64
import itertools
import mimetypes
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from training.data import Episode, Renderer, image_paths
from training.envs import Env
from training.policy.grounding import grounding_pattern, is_grounded


@dataclass(frozen=True)
class Reply:
    text: str
    truncated: bool = False  # cut at the token limit rather than ended by the model
    # The behaviour policy's log-prob of each generated token (the end token included) and those tokens, recorded at
    # generation where the server returns them (RemotePolicy); None where nothing was recorded (LocalPolicy).
    logprobs: tuple[float, ...] | None = None
    token_ids: tuple[int, ...] | None = None


class Policy(Protocol):
    version: int

    def generate(self, conversations: list[list[dict[str, Any]]]) -> tuple[list[Reply], int]: ...

    def generate_one(self, conversation: list[dict[str, Any]]) -> tuple[Reply, int]: ...


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0


class LocalPolicy:
    """A transformers causal LM sampling in-process. Thread-safe: concurrent callers are batched together, and
    `lock` is held while generating, so the trainer takes it to change weights between two batches."""

    def __init__(self, model: Any, renderer: Renderer, sampling: SamplingParams | None = None, max_batch: int = 64):
        self.model, self.renderer = model, renderer
        self.sampling = sampling or SamplingParams()
        self.max_batch = max_batch
        self.version = 0
        self.base_dir: Path | None = None  # where image paths in conversations are relative to (the run directory)
        self.lock = threading.RLock()
        self._requests: queue.Queue[tuple[list[dict[str, Any]], Future[tuple[Reply, int]]]] = queue.Queue()
        self._worker: threading.Thread | None = None
        tokenizer = renderer.tokenizer
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id
        # A model whose config asks for it points only at outlined elements (training/policy/grounding.py).
        self.grounded = is_grounded(getattr(model, "config", None))
        self._token_strings: list[str] | None = None

    def _grounding(self, conversations: list[list[dict[str, Any]]], prompt_length: int) -> list[Any]:
        """The grounded-decoding logits processor for this batch (one pattern per row, None where free), if any."""
        if not self.grounded:
            return []
        from PIL import Image

        from training.policy.constrained import RegexLogitsProcessor, token_strings

        patterns: list[str | None] = []
        for conversation in conversations:
            images = image_paths(conversation)
            if not images:
                patterns.append(None)
                continue
            with Image.open(Path(self.base_dir or ".") / images[-1]) as image:
                patterns.append(grounding_pattern(conversation, *image.size))
        if all(p is None for p in patterns):
            return []
        if self._token_strings is None:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._token_strings = token_strings(self.renderer.tokenizer, vocab)
        return [RegexLogitsProcessor(patterns, self._token_strings, self.eos_id, prompt_length)]

    @torch.no_grad()
    def generate(self, conversations: list[list[dict[str, Any]]]) -> tuple[list[Reply], int]:
        """Sample one reply per conversation, in one batched call; returns the replies and the weights' version.
        Screenshots in the conversations go to a vision-language model as its processor would give them."""
        rendered = [self.renderer.prompt_inputs(c, self.base_dir or ".") for c in conversations]
        prompts = [r["input_ids"] for r in rendered]
        device = next(self.model.parameters()).device
        vision: dict[str, torch.Tensor] = {}
        if any("pixel_values" in r for r in rendered):  # rows' images in row order, as the model's forward expects
            keys = ("pixel_values", "image_grid_thw")
            vision = {k: torch.cat([r[k] for r in rendered if k in r]).to(device) for k in keys}
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding: generation continues every row at the same column
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        s = self.sampling
        with self.lock:
            was_training = self.model.training
            self.model.eval()
            # Pure sampling from π (no top-k, no repetition penalty from the checkpoint's generation config): PPO's
            # ratios assume the tokens were drawn from the very distribution the trainer computes.
            sampling = (
                {
                    "do_sample": True,
                    "temperature": s.temperature,
                    "top_p": s.top_p,
                    "top_k": 0,
                    "repetition_penalty": 1.0,
                }
                if s.temperature > 0
                else {"do_sample": False}
            )
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=attention.to(device),
                **vision,
                max_new_tokens=s.max_new_tokens,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_id,
                suppress_tokens=self.renderer.vision_tokens or None,
                logits_processor=self._grounding(conversations, width),
                **sampling,
            )
            self.model.train(was_training)
            version = self.version
        replies = []
        for row in out[:, width:].tolist():
            ended = self.eos_id in row
            if ended:
                row = row[: row.index(self.eos_id)]
            text = self.renderer.tokenizer.decode([t for t in row if t != self.pad_id])
            replies.append(Reply(text, truncated=not ended))
        return replies, version

    def generate_one(self, conversation: list[dict[str, Any]]) -> tuple[Reply, int]:
        """One reply, batched with whatever other threads are asking for at the same moment."""
        if self._worker is None:
            with self.lock:
                if self._worker is None:
                    self._worker = threading.Thread(target=self._serve, name="local-policy", daemon=True)
                    self._worker.start()
        future: Future[tuple[Reply, int]] = Future()
        self._requests.put((conversation, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            pending = [self._requests.get()]
            while len(pending) < self.max_batch:
                try:
                    pending.append(self._requests.get_nowait())
                except queue.Empty:
                    break
            try:
                replies, version = self.generate([c for c, _ in pending])
            except Exception as exc:  # every waiting episode learns why
                for _, future in pending:
                    future.set_exception(exc)
                continue
            for (_, future), reply in zip(pending, replies, strict=True):
                future.set_result((reply, version))


class RemotePolicy:
    """OpenAI chat completions (vLLM or the embedded server) through the live annotation's `PolicyClient` (retries,
    back-off, one error type). `base_url` is the client's, ending in /v1. Image parts given as file paths are sent as
    data URLs. `version` and `model` are what the caller last synchronised to the server (docs/training.md)."""

    def __init__(self, base_url: str, model: str, sampling: SamplingParams | None = None, api_key: str = "",
                 timeout_s: float = 120.0, record_logprobs: bool = True):  # fmt: skip
        from training.policy.client import PolicyClient

        self.model = model
        self.record_logprobs = record_logprobs
        self.sampling = sampling or SamplingParams()
        self.version = 0
        self.base_dir: Path | None = None  # where image paths in conversations are relative to, unless given per call
        self.client = PolicyClient(base_url, model, api_key=api_key, timeout_s=timeout_s, constrain=False)

    def generate(self, conversations: list[list[dict[str, Any]]]) -> tuple[list[Reply], int]:
        version = self.version
        return [self.generate_one(c)[0] for c in conversations], version

    def generate_one(self, conversation: list[dict[str, Any]], base_dir: Path | None = None,
                     seed: int | None = None) -> tuple[Reply, int]:  # fmt: skip
        """One reply to `conversation`; `seed` makes the server's sampling reproducible (vLLM and the embedded one)."""
        version = self.version
        body = {
            "model": self.model,
            "messages": [_openai_message(m, base_dir or self.base_dir) for m in conversation],
            "max_tokens": self.sampling.max_new_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
        }
        if seed is not None:
            body["seed"] = seed
        if self.record_logprobs:  # OpenAI's logprobs plus vLLM's token ids: no second forward pass to know them
            body.update(logprobs=True, return_token_ids=True)
        choice = self.client.complete(body)["choices"][0]
        text, truncated = choice["message"]["content"] or "", choice.get("finish_reason") == "length"
        return Reply(text, truncated, *recorded_tokens(choice)), version


def recorded_tokens(choice: dict[str, Any]) -> tuple[tuple[float, ...] | None, tuple[int, ...] | None]:
    """The per-token log-probs (OpenAI's `logprobs.content[i].logprob`) and token ids (vLLM's `token_ids`) of one
    chat-completion choice; None for what the server did not return, or log-probs whose count disagrees with the ids."""
    content = (choice.get("logprobs") or {}).get("content")
    logprobs = None if content is None else tuple(float(entry["logprob"]) for entry in content)
    ids = choice.get("token_ids")
    token_ids = None if ids is None else tuple(int(i) for i in ids)
    if logprobs is not None and token_ids is not None and len(logprobs) != len(token_ids):
        return None, token_ids
    return logprobs, token_ids


def _openai_message(message: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, str):
        return {"role": message["role"], "content": content}
    parts = []
    for part in content:
        if part["type"] == "text":
            parts.append({"type": "text", "text": part["text"]})
        else:
            path = (base_dir or Path(".")) / part["image"]
            mime = mimetypes.guess_type(path.name)[0] or "image/png"
            url = f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": message["role"], "content": parts}


def episode_return(episode: Episode) -> float:
    """Outcome plus every per-turn reward: what the episode earned."""
    turns = sum(float(m.get("reward") or 0.0) for m in episode.messages if m["role"] == "assistant")
    return float(episode.reward or 0.0) + turns


def turn_message(reply: Reply, feedback: Any, version: int) -> dict[str, Any]:
    """The assistant message stored for one turn: text, the turn's reward, the policy version, truncation, and the
    generated tokens with their behaviour log-probs where the policy recorded them."""
    message = {"role": "assistant", "content": reply.text, "reward": feedback.reward, "version": version}
    if reply.truncated:
        message["truncated"] = True
    if reply.logprobs is not None:
        message["logprobs"] = list(reply.logprobs)
    if reply.token_ids is not None:
        message["token_ids"] = list(reply.token_ids)
    return message


def run_episode(env: Env, ask: Callable[[list[dict[str, Any]]], tuple[Reply, int]], seed: int,
                max_turns: int = 32) -> Episode:  # fmt: skip
    """Play one episode: the policy answers, the environment responds, until done or `max_turns`. The final turn's
    info (e.g. an evaluator error of a sandbox task) is kept in the episode's meta, with the environment's `meta`
    for this episode where it has one (a sandbox task's id, where its screenshots' paths are relative to)."""
    messages = env.reset(seed)
    started = time.perf_counter()
    done = False
    info: dict[str, Any] = {}
    for _ in range(max_turns):
        reply, version = ask(messages)
        feedback = env.step(reply.text)
        info = feedback.info
        messages.append(turn_message(reply, feedback, version))
        if feedback.done:
            done = True
            break
        assert feedback.observation is not None
        messages.append(feedback.observation)
    episode = _episode(env, messages, seed)
    episode.meta.update(done=done, seconds=time.perf_counter() - started, info=info)
    return episode


def _episode(env: Env, messages: list[dict[str, Any]], seed: int) -> Episode:
    """An episode of `env` played from `seed`, named after its task where the environment says which."""
    meta = {**getattr(env, "meta", {}), "seed": seed}
    task = meta.get("task_id")
    name = f"{env.name}-{task}-{seed}" if task is not None else f"{env.name}-{seed}"
    instruction = env.task["instruction"] if task is not None and hasattr(env, "task") else env.name
    return Episode(messages, id=name, source="rollout", instruction=instruction, meta=meta)


def collect_sync(env_factory: Callable[[], Env], policy: Policy, seeds: list[int], max_turns: int = 32,
                 workers: int = 16, errors: list[str] | None = None) -> list[Episode]:  # fmt: skip
    """The synchronous baseline: all episodes of a batch advance turn by turn (one batched generation per turn,
    environment steps in parallel) and the batch ends when its longest episode does. An environment that fails (a
    sandbox session lost) costs its episode, not the batch: it is left out and its error appended to `errors`;
    only a batch with no episode left raises."""
    envs: list[Env] = []
    failed: dict[int, str] = {}

    def attempt(i: int, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:  # that episode is lost; the others go on
            failed[i] = f"seed {seeds[i]}: {exc}"
            return None

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            envs.extend(env_factory() for _ in seeds)
            resets = list(pool.map(lambda i: attempt(i, lambda: envs[i].reset(seeds[i])), range(len(seeds))))
            conversations: list[list[dict[str, Any]]] = [c or [] for c in resets]
            episodes = [_episode(env, c, seed) for env, c, seed in zip(envs, conversations, seeds, strict=True)]
            active = [i for i in range(len(seeds)) if i not in failed]
            for _ in range(max_turns):
                if not active:
                    break
                replies, version = policy.generate([conversations[i] for i in active])
                steps = list(zip(active, replies, strict=True))
                feedbacks = list(pool.map(lambda pair: attempt(pair[0], lambda: envs[pair[0]].step(pair[1].text)),
                                          steps))  # fmt: skip
                still = []
                for (i, reply), feedback in zip(steps, feedbacks, strict=True):
                    if feedback is None:
                        continue
                    conversations[i].append(turn_message(reply, feedback, version))
                    episodes[i].meta.update(info=feedback.info, done=feedback.done)
                    if not feedback.done and feedback.observation is not None:
                        conversations[i].append(feedback.observation)
                        still.append(i)
                active = still
    finally:  # every environment is closed, whatever happened (a sandbox releases its sessions)
        for env in envs:
            env.close()
    if errors is not None:
        errors.extend(failed[i] for i in sorted(failed))
    if len(failed) == len(seeds):
        raise RuntimeError(f"every episode of the batch failed; the first: {failed[min(failed)]}")
    return [e for i, e in enumerate(episodes) if i not in failed]


class StalenessManager:
    """AReaL's admission rule: episode n (0-based, in start order) may start only while
    n < (max_staleness + version + 1) · batch_size, so no batch the trainer takes was begun more than
    `max_staleness` policy versions ago. max_staleness = 0 is on-policy."""

    def __init__(self, batch_size: int, max_staleness: int):
        self.batch_size, self.max_staleness = batch_size, max_staleness
        self.version = 0
        self.started = 0
        self.cond = threading.Condition()

    def capacity(self) -> int:
        return (self.max_staleness + self.version + 1) * self.batch_size - self.started

    def acquire(self, stop: threading.Event) -> bool:
        """Block until an episode may start (True), or until `stop` is set (False)."""
        with self.cond:
            while self.capacity() <= 0:
                if stop.is_set():
                    return False
                self.cond.wait(timeout=0.1)
            self.started += 1
            return not stop.is_set()

    def advance(self, version: int) -> None:
        with self.cond:
            self.version = version
            self.cond.notify_all()

    def forget(self) -> None:
        """A started episode was thrown away: admit one more."""
        with self.cond:
            self.started -= 1
            self.cond.notify_all()

    def is_stale(self, episode: Episode) -> bool:
        """An episode begun more than `max_staleness` versions before the current one."""
        versions = [m.get("version", self.version) for m in episode.messages if m["role"] == "assistant"]
        return bool(versions) and min(versions) < self.version - self.max_staleness


@dataclass
class PoolStats:
    finished: int = 0
    taken: int = 0
    dropped_stale: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class RolloutPool:
    """A streaming, partially filled pool of episodes: `concurrency` threads play episodes continuously; `take(n)`
    returns the first n finished (oldest first) while unfinished ones keep running; `set_version` after each update."""

    def __init__(self, env_factory: Callable[[], Env], policy: Any, *, batch_size: int, concurrency: int,
                 max_staleness: int = 1, max_turns: int = 32, seeds: Iterator[int] | None = None):  # fmt: skip
        self.env_factory, self.policy = env_factory, policy
        self.max_turns = max_turns
        self.staleness = StalenessManager(batch_size, max_staleness)
        self.stats = PoolStats()
        self._seeds = seeds or itertools.count()
        self._seed_lock = threading.Lock()
        self._finished: queue.Queue[Episode] = queue.Queue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"rollout-{n}", daemon=True)
                         for n in range(concurrency)]  # fmt: skip

    def __enter__(self) -> RolloutPool:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stop(self) -> None:
        """No new episode starts from now on (running ones go on); `close` then waits for the threads."""
        self._stop.set()
        with self.staleness.cond:
            self.staleness.cond.notify_all()

    def close(self) -> None:
        self.stop()
        for thread in self._threads:
            thread.join(timeout=30)

    def _work(self) -> None:
        env = self.env_factory()
        try:
            while self.staleness.acquire(self._stop):
                with self._seed_lock:
                    seed = next(self._seeds)
                try:
                    episode = run_episode(env, self.policy.generate_one, seed, self.max_turns)
                except Exception as exc:  # an environment failure loses that episode, not the pool
                    self.stats.failed += 1
                    self.stats.errors = [*self.stats.errors[-19:], f"seed {seed}: {exc}"]
                    self.staleness.forget()
                    time.sleep(0.05)  # a broken environment must not spin the CPU
                    continue
                self.stats.finished += 1
                self._finished.put(episode)
        finally:
            env.close()

    def take(self, n: int, timeout_s: float = 600.0) -> list[Episode]:
        """The next n finished, fresh-enough episodes (blocks until there are n)."""
        batch: list[Episode] = []
        deadline = time.monotonic() + timeout_s
        while len(batch) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"only {len(batch)} of {n} episodes finished in {timeout_s:.0f} s "
                                   f"({self.stats.failed} failed: {self.stats.errors[-1:]})")  # fmt: skip
            try:
                episode = self._finished.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if self.staleness.is_stale(episode):
                self.stats.dropped_stale += 1
                self.staleness.forget()  # its slot goes to a fresh episode
                continue
            batch.append(episode)
        self.stats.taken += n
        return batch

    def set_version(self, version: int) -> None:
        self.policy.version = version
        self.staleness.advance(version)
