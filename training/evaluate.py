"""Demonstrations and evaluation on the built-in verifiable environments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from training.data import Renderer, write_episodes
from training.envs import make_text_env
from training.models import load_actor, load_tokenizer
from training.rollout import LocalPolicy, Reply, SamplingParams, collect_sync, episode_return, run_episode


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
) -> dict[str, Any]:
    """Mean episode return (and its standard error) over `episodes` seeds, greedy by default."""
    tokenizer, processor = load_tokenizer(model_path)
    policy = LocalPolicy(load_actor(model_path).eval(), Renderer(tokenizer, image_processor=processor),
                         SamplingParams(max_new_tokens, temperature))  # fmt: skip
    played = collect_sync(lambda: make_text_env(env_spec), policy, [seed + n for n in range(episodes)], max_turns)
    returns = torch.tensor([episode_return(e) for e in played])
    return {
        "model": model_path,
        "env": env_spec,
        "episodes": episodes,
        "mean_return": float(returns.mean()),
        "stderr": float(returns.std() / episodes**0.5) if episodes > 1 else 0.0,
        "example": played[0].messages[-1]["content"],
    }
