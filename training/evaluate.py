"""Demonstrations, and evaluation of a model on the built-in verifiable environments or on sandbox tasks: success
rate with a Wilson 95 % interval, mean return with its standard error, counts per task, and what went wrong."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from training import dist
from training.data import Episode, Renderer, write_episodes
from training.envs import (
    Env,
    SandboxSettings,
    is_sandbox,
    load_tasks,
    make_sandbox_env,
    make_text_env,
    sandbox_options,
)
from training.envs import sandbox_api_key as default_api_key
from training.envs import sandbox_url as default_url
from training.models import load_actor, load_tokenizer
from training.rollout import LocalPolicy, RemotePolicy, Reply, SamplingParams, collect_sync, episode_return, run_episode

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile


def write_demonstrations(env_spec: str, episodes: int, out: Path, seed: int = 10_000) -> int:
    """Episodes played by the environment's expert (an SFT store); seeds start at `seed`, apart from evaluation's."""
    env = make_text_env(env_spec)
    played = (run_episode(env, lambda _: (Reply(env.expert()), 0), seed + n) for n in range(episodes))
    return write_episodes(out, (_as_demo(e) for e in played))


def _as_demo(episode: Any) -> Any:
    episode.source = "demonstration"
    for message in episode.messages:
        message.pop("version", None)
    return episode


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (95 % by default): sound at 0 % and 100 % and for few
    episodes, where the normal approximation gives intervals outside [0, 1] or of zero width. n = 0 gives [0, 1]."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n ({successes} of {n})")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else min(p, max(0.0, centre - half))
    high = 1.0 if successes == n else max(p, min(1.0, centre + half))
    return low, high


def episode_score(episode: Episode) -> float:
    """What decides success: a sandbox task's evaluator score (format penalties apart), else the episode's return."""
    info = episode.meta.get("info") or {}
    return float(info["score"]) if "score" in info else episode_return(episode)


def summarise(episodes: list[Episode], *, model: str, env: str, errors: list[dict[str, Any]] | None = None,
              threshold: float = 1.0) -> dict[str, Any]:  # fmt: skip
    """The evaluation report: success = score ≥ `threshold`; episodes that could not be played are left out of the
    counts and listed in `errors` (with evaluator errors, which count as failures: the env scored them 0)."""
    errors = list(errors or [])
    returns = [episode_return(e) for e in episodes]
    wins = [episode_score(e) >= threshold for e in episodes]
    n, successes = len(episodes), sum(wins)
    low, high = wilson_interval(successes, n)
    by_task: dict[str, dict[str, int]] = {}
    for episode, won in zip(episodes, wins, strict=True):
        counts = by_task.setdefault(str(episode.meta.get("task_id", env)), {"episodes": 0, "successes": 0})
        counts["episodes"] += 1
        counts["successes"] += int(won)
        info = episode.meta.get("info") or {}
        if "evaluator_error" in info:
            errors.append({"seed": episode.meta.get("seed"), "task_id": episode.meta.get("task_id"),
                           "error": f"evaluator: {info['evaluator_error']}"})  # fmt: skip
    mean = sum(returns) / n if n else 0.0
    spread = math.sqrt(sum((r - mean) ** 2 for r in returns) / (n - 1)) if n > 1 else 0.0
    return {
        "model": model,
        "env": env,
        "episodes": n,
        "successes": successes,
        "success_rate": successes / n if n else 0.0,
        "ci_low": low,
        "ci_high": high,
        "mean_return": mean,
        "stderr": spread / math.sqrt(n) if n > 1 else 0.0,
        "by_task": by_task,
        "errors": errors,
    }


def play(env_factory: Callable[[], Env], ask: Callable[[list[dict[str, Any]]], tuple[Reply, int]], seeds: list[int],
         *, max_turns: int, concurrency: int,
         on_episode: Callable[[int], None] | None = None) -> tuple[list[Episode], list[dict[str, Any]]]:  # fmt: skip
    """One episode per seed, `concurrency` at a time: the episodes in seed order and, for those that could not be
    played (a sandbox failure), what went wrong. An environment plays episode after episode (a sandbox environment
    keeps its browser session for the next task); one whose episode failed is closed and replaced, and every one is
    closed at the end, whatever happens. `on_episode(n)` is told how many episodes have ended (played or failed)."""
    done: dict[int, Episode] = {}
    errors: list[dict[str, Any]] = []
    lock = threading.Lock()
    envs: list[Any] = []  # every environment made, closed at the end
    idle: list[Any] = []  # those free for the next episode
    stop = threading.Event()

    def one(seed: int) -> None:
        if stop.is_set():
            return
        with lock:
            env = idle.pop() if idle else None
        if env is None:
            env = env_factory()
            with lock:
                envs.append(env)
        try:
            episode = run_episode(env, ask, seed, max_turns)
        except Exception as exc:  # one broken episode is reported, not fatal to the evaluation
            with lock:
                errors.append({"seed": seed, "task_id": getattr(env, "meta", {}).get("task_id"), "error": str(exc)})
                ended = len(done) + len(errors)
            env.close()  # what it holds may be broken: a later episode starts a new one
        else:
            with lock:
                done[seed] = episode
                idle.append(env)
                ended = len(done) + len(errors)
        if on_episode is not None:
            on_episode(ended)

    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        list(pool.map(one, seeds))
    except BaseException:  # Ctrl-C, SIGTERM: no new episode, and every open environment closed (sessions released)
        stop.set()
        raise
    finally:
        with lock:
            for env in envs:
                env.close()
        pool.shutdown(wait=True, cancel_futures=True)
    return [done[s] for s in seeds if s in done], sorted(errors, key=lambda e: e["seed"])


@torch.no_grad()
def evaluate_checkpoint(
    model_path: str,
    env_spec: str,
    *,
    episodes: int = 64,
    seed: int = 1_000_000,
    temperature: float = 0.0,
    max_new_tokens: int = 32,
    max_turns: int = 32,
    tasks: str = "",
    sandbox_url: str = "",
    sandbox_api_key: str = "",
    base_url: str = "",
    served_model: str = "",
    api_key: str = "",
    success_threshold: float = 1.0,
    concurrency: int = 4,
    out: str = "",
    progress: str = "",
) -> dict[str, Any]:
    """Play `episodes` seeds (greedy by default) with the checkpoint loaded here, or through an OpenAI-compatible
    endpoint (`base_url`, e.g. vLLM serving it as `served_model`), on a text env or on sandbox tasks (seed n plays
    task n mod count; screenshots and the episodes go to `out`, else to a temporary folder removed afterwards).
    With `progress`, a JSON line `{"step": n, "episodes": total}` is appended to that file as each episode ends
    (sandbox and endpoint play; the flywheel's evaluate stage shows it live)."""
    if episodes < 1:
        raise ValueError("--episodes must be at least 1")
    seeds = [seed + n for n in range(episodes)]
    sampling = SamplingParams(max_new_tokens, temperature)
    sandbox = is_sandbox(env_spec)
    found = load_tasks(tasks) if sandbox and tasks else []  # read and checked before any model is loaded
    if sandbox:
        sandbox_options(env_spec)
    if sandbox and not found:
        raise ValueError("--env sandbox needs --tasks FILE (a JSON list or JSONL of OSWorld-format tasks)")
    if not sandbox:
        make_text_env(env_spec)  # an unknown environment fails now
    with contextlib.ExitStack() as stack:
        run_dir = Path(out) if out else None
        if run_dir is None and sandbox:  # screenshots need a home while the episodes run; removed afterwards
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="eval-")))
        policy = _policy(model_path, sampling, base_url, served_model, api_key)
        policy.base_dir = run_dir
        ended = progress_writer(stack, progress, episodes)
        if sandbox:
            assert run_dir is not None
            settings = SandboxSettings(found, default_url(sandbox_url), default_api_key(sandbox_api_key),
                                       run_dir / "images", owner="evaluation")  # fmt: skip
            played, errors = play(lambda: make_sandbox_env(env_spec, settings), policy.generate_one, seeds,
                                  max_turns=max_turns, concurrency=concurrency, on_episode=ended)  # fmt: skip
        elif base_url:
            played, errors = play(lambda: make_text_env(env_spec), policy.generate_one, seeds, max_turns=max_turns,
                                  concurrency=concurrency, on_episode=ended)  # fmt: skip
        else:
            played, errors = collect_sync(lambda: make_text_env(env_spec), policy, seeds, max_turns), []
        report = summarise(played, model=model_path, env=env_spec, errors=errors, threshold=success_threshold)
        if out:
            write_episodes(Path(out) / "episodes.jsonl", played)
            report["out"] = out
    if played and not sandbox:
        report["example"] = played[0].messages[-1]["content"]
    return report


def progress_writer(stack: contextlib.ExitStack, path: str, episodes: int) -> Callable[[int], None] | None:
    """`on_episode` for `play` that appends `{"step": n, "episodes": total}` to `path` (None without a path)."""
    if not path:
        return None
    handle = stack.enter_context(open(path, "a", encoding="utf-8"))
    lock = threading.Lock()

    def ended(n: int) -> None:
        with lock:
            handle.write(json.dumps({"step": n, "episodes": episodes}) + "\n")
            handle.flush()

    return ended


def _policy(model_path: str, sampling: SamplingParams, base_url: str, served_model: str,
            api_key: str) -> LocalPolicy | RemotePolicy:  # fmt: skip
    """The checkpoint loaded here, or the model behind an OpenAI-compatible endpoint."""
    if base_url:
        return RemotePolicy(base_url, served_model or model_path, sampling, api_key=api_key, record_logprobs=False)
    tokenizer, processor = load_tokenizer(model_path)
    model = load_actor(model_path).to(dist.device()).eval()
    return LocalPolicy(model, Renderer(tokenizer, image_processor=processor), sampling)
