#!/usr/bin/env python3
"""PPO update throughput: our trainer (training.ppo.PPOTrainer) against TRL's PPO trainer, same model, same batch.

What is timed is the update phase, everything after generation: the no-grad forward passes (old log-probs, reference
log-probs, values), rewards with the KL penalty, GAE and whitening, then the PPO epochs (forward, backward, optimizer
steps of actor and critic). Generation is excluded from both sides. Figure: tokens/s = response tokens in the batch x
PPO epochs / update seconds (median over the repeats), the same count for both; goal: ours >= 1.5x TRL.

Fairness rules (both sides, in one process, one after the other in each round):
- The same tiny checkpoint (a random text-only Qwen2 built from a config by training.policy.tiny; --hidden/--layers).
  Actor, frozen reference copy and critic (same backbone + a zero-initialised scalar head) on each side.
- The same batch: --batch sequences of --prompt-tokens prompt tokens and a response of --response-tokens tokens
  ("fixed") or of long-tailed lengths with that mean ("long-tailed", log-normal, seeded); the same token ids (TRL's
  query/response tensors are cut from our rendered episodes, responses padded as a generation pads them), the same
  per-sequence reward on the last response token, every response token trained. Both scenarios run by default
  (--lengths).
- The same PPO settings: --epochs, --minibatches optimizer steps per epoch (TRL: per_device_train_batch_size = batch,
  gradient_accumulation_steps = 1, num_mini_batches = minibatches), KL penalty 0.05 in the reward with the k1
  estimator, gamma 1, lambda 0.95 for advantages and returns, advantages whitened, ratio clip 0.2 both ways (our
  clip-higher and dual clip off), value clip 0.2, no entropy bonus, AdamW with the same learning rate, no weight decay.
- fp32 on CPU, the same number of torch threads (--threads), no gradient checkpointing and no bf16 (TRL's defaults
  turn both on; they are turned off here), no dropout.
- Each side is warmed up once, then both are timed --repeats times, alternating, and the median is reported.

How TRL's update phase is isolated: TRL's `PPOTrainer.train()` runs as it is, one call per timed update
(total_episodes = batch, so one batch per call), with two functions of its own module replaced: `batch_generation`
returns the fixed batch (query + response ids and the logits of the same initial policy, computed once up front,
which is what TRL's generation hands back as scores) and starts the clock; `get_reward`, when called on the reward
model, returns the fixed scores (calls on the value model go through TRL's own function). A callback stops the clock
at `on_step_end`, so the timed window is exactly TRL's own code after generation: reference and value forwards,
log-probs from the generation logits, KL-penalised rewards, GAE, whitening, the PPO epochs, and its per-step metrics.
The console logging callbacks are removed and the learning rate is constant (its schedule would otherwise end at 0).
Ours is timed over `PPOTrainer.prepare(episodes)` (rendering included) + `PPOTrainer.update(batch)`.

Known differences (see bench/README.md): TRL takes the old log-probs from the generation's logits, ours recomputes
them with a forward pass (one more no-grad forward on our side, about 1/27 of the model work at 4 epochs); TRL trains
actor and critic with one loss (value loss x vf_coef 0.1) and one optimizer, ours with two; ours clips gradient norms
(TRL's PPO loop does not); TRL pads every pass to the batch's longest response, ours packs sequences into
padding-free rows (training.packing); our rendering ends each sequence with the chat template's "\n" after
<|im_end|> (one more token, never trained); TRL runs no reward model here (ours never has one: rewards come from the
environment).

Install TRL apart from .venv first (PPO was removed from TRL in 1.13.0, so this pins 1.12.0):
  .venv/bin/pip install --target var/bench-trl --no-deps -r bench/requirements-trl.txt
Usage: .venv/bin/python bench/ppo_vs_trl.py [--hidden 256 --layers 4 --batch 32 --epochs 4 --minibatches 4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import random
import statistics
import string
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# TRL lives apart from .venv, and after its site-packages: torch, transformers, accelerate come from .venv
sys.path.append(str(Path(__file__).resolve().parent.parent / "var" / "bench-trl"))
import torch

from training.data import Episode, Renderer
from training.policy.tiny import build_tiny_text_checkpoint
from training.ppo import PPOConfig, PPOTrainer

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ".venv/bin/pip install --target var/bench-trl --no-deps -r bench/requirements-trl.txt"
KL_COEF = 0.05
LAM = 0.95
CLIP = 0.2


def import_trl() -> Any:
    """TRL's PPO module, or exit with the install command."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import trl
            from trl.experimental.ppo import ppo_trainer
    except ImportError as exc:
        sys.exit(
            f"TRL's PPO trainer is not importable ({exc}); TRL 1.13 and later have none.\n"
            f"Install TRL 1.12.0 apart from .venv, from {ROOT}:\n  {INSTALL}"
        )
    return trl, ppo_trainer


def clock() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds over all its threads)."""
    return time.perf_counter(), time.process_time()


def elapsed(started: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = clock()
    return wall - started[0], cpu - started[1]


def quiet() -> None:
    """No progress bars, load reports or deprecation warnings from transformers and TRL in the output."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*degrees of freedom")  # TRL's ratio variance over one minibatch


def response_lengths(args: argparse.Namespace, scenario: str) -> list[int]:
    """Response tokens per sequence: all --response-tokens ("fixed"), or long-tailed like agent turns ("long-tailed":
    log-normal with sigma 1 and the same mean, seeded, clamped to 2..4x the mean)."""
    if scenario == "fixed":
        return [args.response_tokens] * args.batch
    rng = random.Random(args.seed + 1)
    mu = math.log(args.response_tokens) - 0.5  # a log-normal's mean is exp(mu + sigma^2 / 2)
    return [min(max(2, round(rng.lognormvariate(mu, 1.0))), 4 * args.response_tokens) for _ in range(args.batch)]


def make_episodes(tokenizer: Any, args: argparse.Namespace, lengths: list[int]
                  ) -> tuple[list[Episode], torch.Tensor, torch.Tensor]:  # fmt: skip
    """One-turn episodes rendering to exactly --prompt-tokens prompt + lengths[i] response tokens (byte-level
    tokenizer: one token per character), their token ids (B, prompt + longest response; padded after each response,
    as a generation hands them to TRL) and rewards (B,)."""
    renderer = Renderer(tokenizer)
    header = len(renderer.prompt_ids([{"role": "user", "content": ""}]))  # chat template around the prompt
    if args.prompt_tokens <= header or args.response_tokens < 2:
        sys.exit(f"--prompt-tokens must be > {header} (the chat template's own tokens), --response-tokens >= 2")
    rng = random.Random(args.seed)
    letters = string.ascii_lowercase + " "
    p, width = args.prompt_tokens, max(lengths)
    episodes = []
    ids = torch.full((len(lengths), p + width), tokenizer.pad_token_id, dtype=torch.long)
    for i, r in enumerate(lengths):
        prompt = "".join(rng.choice(letters) for _ in range(args.prompt_tokens - header))
        reply = "".join(rng.choice(letters) for _ in range(r - 1))  # + <|im_end|>
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        episode = Episode(messages=messages, id=f"bench-{i}", reward=rng.random())
        sample = renderer.render(episode)
        # our rendering adds the template's "\n" after <|im_end|>: one more token, never trained
        assert len(sample) == p + r + 1, len(sample)
        assert sample.loss_mask[:p].sum() == 0 and sample.loss_mask[p : p + r].sum() == r
        assert int(sample.input_ids[p + r - 1]) == tokenizer.eos_token_id
        episodes.append(episode)
        ids[i, : p + r] = sample.input_ids[: p + r]
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
    return episodes, ids, rewards


class Ours:
    def __init__(self, model: Path, out: Path, episodes: list[Episode], args: argparse.Namespace):
        cfg = PPOConfig(model=str(model), out=str(out), episodes_per_step=args.batch, streaming=False,
                        ppo_epochs=args.epochs, minibatches=args.minibatches, actor_lr=args.lr, critic_lr=args.lr,
                        advantage="gae", gamma=1.0, lam_critic=LAM, lam_policy=LAM, length_adaptive=False,
                        normalize_advantages=True, eps_low=CLIP, eps_high=CLIP, dual_clip=0.0, value_clip=CLIP,
                        entropy_coef=0.0, kl_coef=KL_COEF, kl_in="reward", kl_estimator="kl", seed=args.seed,
                        progress=False)  # fmt: skip
        self.trainer = PPOTrainer(cfg)
        self.episodes = episodes

    def update(self) -> tuple[float, float]:
        started = clock()
        batch = self.trainer.prepare(self.episodes)
        batch.pop("stats")
        self.trainer.update(batch)
        return elapsed(started)


class Trl:
    """TRL's PPOTrainer with generation replaced by the fixed batch and the reward model by the fixed rewards."""

    def __init__(self, module: Any, model: Path, out: Path, ids: torch.Tensor, rewards: torch.Tensor,
                 args: argparse.Namespace):  # fmt: skip
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
            PrinterCallback,
            ProgressCallback,
            TrainerCallback,
        )

        p = args.prompt_tokens
        tokenizer = AutoTokenizer.from_pretrained(model)
        policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        value = AutoModelForSequenceClassification.from_pretrained(model, num_labels=1, dtype=torch.float32)
        torch.nn.init.zeros_(value.score.weight)  # like our Critic's head: V = 0 at the start
        with torch.no_grad():  # what generation would hand back: the sampling policy's logits at the response
            attention = (ids != tokenizer.pad_token_id).long()
            logits = policy(input_ids=ids, attention_mask=attention).logits[:, p - 1 : -1]
        self.ids, self.logits = ids, logits / (1.0 + 1e-7)  # TRL's generation temperature is temperature + 1e-7
        self.row_of = {tuple(q.tolist()): i for i, q in enumerate(ids[:, :p])}
        self.rewards = rewards
        self.started = clock()
        self.times: list[tuple[float, float]] = []
        bench = self

        class FixedReward(torch.nn.Module):
            base_model_prefix = "none"

        self.reward_model = FixedReward()
        real_get_reward = module.get_reward

        def batch_generation(model, queries, local_rollout_forward_batch_size, pad_token_id, generation_config):  # type: ignore[no-untyped-def]
            rows = [bench.row_of[tuple(q.tolist())] for q in queries]
            out = bench.ids[rows].clone(), bench.logits[rows].clone()
            bench.started = clock()
            return out

        def get_reward(model, query_responses, pad_token_id, context_length):  # type: ignore[no-untyped-def]
            if model is not bench.reward_model:
                return real_get_reward(model, query_responses, pad_token_id, context_length)
            rows = [bench.row_of[tuple(q.tolist())] for q in query_responses[:, :context_length]]
            return None, bench.rewards[rows].clone(), None

        class StopClock(TrainerCallback):
            def on_step_end(self, *_: Any, **__: Any) -> None:
                bench.times.append(elapsed(bench.started))

        module.batch_generation = batch_generation
        module.get_reward = get_reward
        config = module.PPOConfig(
            output_dir=str(out), report_to=[], save_strategy="no", use_cpu=True, bf16=False, fp16=False,
            gradient_checkpointing=False, seed=args.seed, learning_rate=args.lr, lr_scheduler_type="constant",
            weight_decay=0.0, per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
            num_mini_batches=args.minibatches, num_ppo_epochs=args.epochs, total_episodes=args.batch,
            local_rollout_forward_batch_size=args.batch, response_length=ids.shape[1] - p, stop_token="eos",
            temperature=1.0, missing_eos_penalty=None, kl_coef=KL_COEF, kl_estimator="k1", whiten_rewards=False,
            gamma=1.0, lam=LAM, cliprange=CLIP, cliprange_value=CLIP, num_sample_generations=0,
            dataloader_num_workers=0, disable_tqdm=True,
        )  # fmt: skip
        # a list of rows is all TRL's DataLoader needs (datasets' fingerprinting of a Dataset trips on pyarrow 26)
        dataset = [{"input_ids": q} for q in ids[:, :p].tolist()]
        self.trainer = module.PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=reference,
                                         reward_model=self.reward_model, train_dataset=dataset, value_model=value,
                                         eval_dataset=dataset, callbacks=[StopClock()])  # fmt: skip
        for callback in (PrinterCallback, ProgressCallback):
            self.trainer.remove_callback(callback)

    def update(self) -> tuple[float, float]:
        done = len(self.times)
        with contextlib.redirect_stdout(io.StringIO()):  # its "===training policy===" banner, before the clock starts
            self.trainer.train()  # one batch: total_episodes = batch
        assert len(self.times) == done + 1
        return self.times[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        type=Path,
        help="a text checkpoint from `python -m training tiny` (byte-level tokenizer); default: built here",
    )
    parser.add_argument("--hidden", type=int, default=256, help="tiny model width")
    parser.add_argument("--layers", type=int, default=4, help="tiny model depth")
    parser.add_argument("--batch", type=int, default=32, help="sequences per update")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=64, help="response tokens (the mean when long-tailed)")
    parser.add_argument("--epochs", type=int, default=4, help="PPO epochs per update")
    parser.add_argument("--minibatches", type=int, default=4, help="optimizer steps per epoch")
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per side (after one warm-up each)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads, both sides")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lengths", type=lambda v: v.split(","), default=["fixed", "long-tailed"],
                        help="response-length scenarios, comma-separated: fixed, long-tailed")  # fmt: skip
    args = parser.parse_args()
    if set(args.lengths) - {"fixed", "long-tailed"}:
        sys.exit("--lengths takes fixed and/or long-tailed")
    if args.batch % args.minibatches:
        sys.exit("--batch must be a multiple of --minibatches (TRL needs equal minibatches)")
    trl, module = import_trl()
    quiet()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_tiny_text_checkpoint(Path(tmp) / "model", hidden=args.hidden, layers=args.layers)
        from training.models import load_tokenizer

        tokenizer, _ = load_tokenizer(model)
        for scenario in args.lengths:
            lengths = response_lengths(args, scenario)
            episodes, ids, rewards = make_episodes(tokenizer, args, lengths)
            ours = Ours(model, Path(tmp) / f"ours-{scenario}", episodes, args)
            theirs = Trl(module, model, Path(tmp) / f"trl-{scenario}", ids, rewards, args)
            params = sum(p.numel() for p in ours.trainer.actor.parameters())
            times: dict[str, list[tuple[float, float]]] = {"trl": [], "ours": []}
            for round_ in range(args.repeats + 1):  # round 0 warms both up
                for name, side in (("trl", theirs), ("ours", ours)):
                    torch.set_num_threads(args.threads)
                    took = side.update()
                    if round_:
                        times[name].append(took)
            rows.append((scenario, lengths, times))
        threads = torch.get_num_threads()
    load_after = os.getloadavg()[0]
    size = f"from {args.model}" if args.model else f"hidden {args.hidden} x {args.layers} layers"
    print(f"PPO update phase (generation excluded), fp32 CPU, {threads} torch threads on {os.cpu_count()} cores; "
          f"tiny Qwen2 {size}, {params / 1e6:.2f}M parameters per model (actor, reference, critic); batch "
          f"{args.batch} x ({args.prompt_tokens} prompt + response) tokens, {args.epochs} PPO epochs x "
          f"{args.minibatches} minibatches, KL {KL_COEF} (k1, in the reward), lambda {LAM}, clip {CLIP}; median of "
          f"{args.repeats} after 1 warm-up, alternating; 1-min load average {load_before:.1f} before, "
          f"{load_after:.1f} after; torch {torch.__version__}, trl {trl.__version__}\n")  # fmt: skip
    print("| response lengths | PPO update, same model and batch | seconds/update (median) | min..max | "
          "CPU seconds/update | tokens/s | vs TRL | goal |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for scenario, lengths, times in rows:
        shape = (f"fixed: {lengths[0]}" if scenario == "fixed" else
                 f"long-tailed: mean {statistics.mean(lengths):.0f}, median {statistics.median(lengths):.0f}, "
                 f"max {max(lengths)}")  # fmt: skip
        tokens = sum(lengths) * args.epochs
        wall = {name: statistics.median(w for w, _ in runs) for name, runs in times.items()}
        cpu = {name: statistics.median(c for _, c in runs) for name, runs in times.items()}
        for name, label, goal in (("trl", f"TRL {trl.__version__} PPOTrainer (baseline)", ""),
                                  ("ours", "ours: training.ppo.PPOTrainer prepare + update", ">= 1.5x")):  # fmt: skip
            walls = [w for w, _ in times[name]]
            print(f"| {shape} | {label} | {wall[name]:.2f} | {min(walls):.2f}..{max(walls):.2f} | {cpu[name]:.2f} | "
                  f"{tokens / wall[name]:,.0f} | {wall['trl'] / wall[name]:.2f}x | {goal} |")  # fmt: skip
    print(
        "\ntokens/s = response tokens in the batch x epochs / update seconds (wall clock), the same count for both. "
        "Same checkpoint, token ids, rewards, epochs, minibatches, PPO settings (KL, GAE, whitening, clips, AdamW), "
        "fp32, no gradient checkpointing and the same threads on both sides; each side warmed up once, then timed "
        "alternately. Generation excluded (TRL: its batch_generation returns the fixed batch and starts the clock, "
        "on_step_end stops it; ours: prepare + update). TRL reuses the generation's logits as old log-probs, ours "
        "recomputes them (one more forward pass). TRL runs every pass over the batch padded to its longest response; "
        "ours packs sequences into padding-free rows (training.packing). CPU seconds (all threads) are shown because "
        "wall time on a shared machine moves with its load."
    )


if __name__ == "__main__":
    main()
