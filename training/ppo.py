"""Multi-turn PPO with the UI-TARS-2 stabilisers (report 2.5.3–2.5.4), value pretraining, and the training loop.

One iteration: take a batch of finished episodes from the rollout pool (or a synchronous batch), render them to tokens
(observation tokens masked), shape rewards, compute old log-probs, values and advantages (decoupled GAE with
length-adaptive λ_policy, or GRPO, or Pass@k), then `ppo_epochs` passes of minibatch updates with the clip-higher
dual-clip token-mean loss for the actor and the clipped value loss for the critic. Value pretraining is the same
loop with the actor frozen, the critic trained on Monte-Carlo targets (λ = 1), and a stop once it has settled.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from training import algos, checkpoints, dist, packing
from training.data import Episode, Renderer, collate
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
from training.metrics import MetricsLogger
from training.models import Critic, LoraSettings, load_actor, load_tokenizer, model_inputs, save_actor, token_log_probs
from training.rewards import Shaping
from training.rollout import LocalPolicy, RolloutPool, SamplingParams, collect_sync, episode_return


@dataclass
class PPOConfig:
    """Every option of a PPO or value-pretraining run, with the report's defaults (DAPO/VC-PPO/VAPO values)."""

    model: str  # actor checkpoint (usually the SFT result)
    out: str  # run directory
    env: str = "copy"  # "copy:turns=3", "guess" (training.envs.make_text_env) or "sandbox[:max_steps=8]" (tasks)
    tasks: str = ""  # --env sandbox: task file (JSON list or JSONL of OSWorld tasks); seed n plays task n mod count
    sandbox_url: str = ""  # --env sandbox: the sandbox service ("" = $SANDBOX_URL, else http://127.0.0.1:8010)
    sandbox_api_key: str = ""  # --env sandbox: its API key ("" = $SANDBOX_API_KEY)
    critic: str = ""  # critic checkpoint (a value-pretraining result); "" = the actor's backbone with a zero head
    # rollouts
    episodes_per_step: int = 32  # episodes per update (per rank)
    group_size: int = 1  # episodes played from each seed (GRPO/Pass@k compare within a group)
    max_turns: int = 16
    max_new_tokens: int = 32  # per turn
    temperature: float = 1.0
    top_p: float = 1.0
    streaming: bool = True  # streaming pool (False: synchronous batches)
    concurrency: int = 48  # episodes in flight in the pool
    max_staleness: int = 1  # policy versions an episode may lag behind the trainer (0 = on-policy)
    # optimisation
    iterations: int = 100
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    ppo_epochs: int = 1
    minibatches: int = 1  # optimizer steps per epoch (each over 1/minibatches of the batch)
    grad_clip: float = 1.0
    pack: bool = True  # padding-free forward passes: sequences share rows (training.packing); text-only batches
    max_length: int = 32768  # tokens per rendered episode (screenshots count: ~1.3k tokens each at 1288×812)
    # advantages
    advantage: str = "gae"  # "gae" (actor-critic), "grpo" or "pass_at_k" (critic-free, per group)
    gamma: float = 1.0
    lam_critic: float = 1.0  # decoupled GAE: critic targets (1.0 = Monte-Carlo, unbiased)
    lam_policy: float = 0.95  # actor advantages, when not length-adaptive
    length_adaptive: bool = True  # λ_policy = 1 − 1/(α·l) per episode (VAPO)
    alpha: float = 0.05
    pass_k: int = 4
    normalize_advantages: bool = False  # whiten GAE advantages over the batch's generated tokens
    # losses
    eps_low: float = 0.2
    eps_high: float = 0.28  # clip-higher (DAPO)
    dual_clip: float = 3.0  # 0 disables
    value_clip: float = 0.2  # 0 disables
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # 0: no reference model
    kl_in: str = "reward"  # "reward" (per-token penalty before GAE) or "loss" (added to the actor loss)
    kl_estimator: str = "low_var_kl"
    shaping: Shaping = field(default_factory=Shaping)
    # value pretraining (stage "value")
    value_max_steps: int = 50
    value_settle_tol: float = 0.05  # relative change of value loss counted as settled
    value_settle_patience: int = 3  # settled this many steps in a row → stop
    # run
    seed: int = 0
    save_every: int = 0
    keep: int = 2
    resume: bool = False
    lora: LoraSettings = field(default_factory=LoraSettings)
    progress: bool = True

    def check(self) -> None:
        if self.advantage not in ("gae", "grpo", "pass_at_k"):
            raise ValueError(f"advantage must be gae, grpo or pass_at_k, not {self.advantage!r}")
        if self.kl_in not in ("reward", "loss"):
            raise ValueError("kl_in must be 'reward' or 'loss'")
        if self.advantage == "pass_at_k" and self.group_size < self.pass_k:
            raise ValueError(f"pass_at_k needs group_size ≥ pass_k ({self.group_size} < {self.pass_k})")
        if is_sandbox(self.env) and not self.tasks:
            raise ValueError("--env sandbox needs --tasks FILE (a JSON list or JSONL of OSWorld-format tasks)")


class PPOTrainer:
    """Actor, critic, optional reference, optimizers, the in-process policy and the rollout source."""

    def __init__(self, cfg: PPOConfig, *, train_actor: bool = True):
        cfg.check()
        self.cfg = cfg
        self.rank, self.world = dist.init()
        torch.manual_seed(cfg.seed + self.rank)
        self.device = dist.device()
        self.out = Path(cfg.out)
        self.sandbox: SandboxSettings | None = None
        if is_sandbox(cfg.env):  # the task file and the spec are checked before a model is loaded or a session leased
            sandbox_options(cfg.env)
            self.sandbox = SandboxSettings(load_tasks(cfg.tasks), default_url(cfg.sandbox_url),
                                           default_api_key(cfg.sandbox_api_key), self.out / "images",
                                           owner=f"trainer:{self.out.name}")  # fmt: skip
        else:
            make_text_env(cfg.env)
        self.tokenizer, self.processor = load_tokenizer(cfg.model)
        self.renderer = Renderer(self.tokenizer, image_processor=self.processor, max_length=cfg.max_length)
        self.actor = load_actor(cfg.model, cfg.lora).to(self.device)
        self.train_actor = train_actor
        self.critic = None
        if cfg.advantage == "gae" or not train_actor:
            self.critic = Critic.from_pretrained(cfg.critic or cfg.model).to(self.device)
        self.reference = None
        if cfg.kl_coef > 0 and not hasattr(self.actor, "disable_adapter"):
            self.reference = copy.deepcopy(self.actor).eval().requires_grad_(False)
        self.actor_ddp = dist.wrap(self.actor) if train_actor else self.actor
        self.critic_ddp = dist.wrap(self.critic) if self.critic is not None else None
        trainable = [p for p in self.actor.parameters() if p.requires_grad]
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        if train_actor:
            self.optimizers["actor"] = adamw(trainable, cfg.actor_lr)
        if self.critic is not None:
            self.optimizers["critic"] = adamw(self.critic.parameters(), cfg.critic_lr)
        sampling = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p)
        self.policy = LocalPolicy(self.actor, self.renderer, sampling, max_batch=max(cfg.concurrency, 1))
        self.policy.base_dir = self.out  # screenshots are saved under the run directory, named relative to it
        self._envs: weakref.WeakSet[Any] = weakref.WeakSet()
        self.version = 0
        self._seed_counter = itertools.count(self.rank, self.world)
        self.pack = packing.usable(cfg.pack, self.actor, len(self.tokenizer))

    # --- rollouts --------------------------------------------------------------------------------------------------

    def seeds(self) -> Iterator[int]:
        """Seed n of this rank, each repeated group_size times (a group = one task played several times)."""
        group = self.cfg.group_size
        return (s for s in self._seed_counter for _ in range(group))

    def env_factory(self) -> Env:
        """A new environment of the run's kind; sandbox ones are remembered so `close_envs` can release them."""
        if self.sandbox is None:
            return make_text_env(self.cfg.env)
        env = make_sandbox_env(self.cfg.env, self.sandbox)
        self._envs.add(env)
        return env

    def close_envs(self) -> None:
        """Close every environment still open: each gives its sandbox session back (Ctrl-C, errors, normal end)."""
        for env in list(self._envs):
            env.close()

    def concurrency(self) -> int:
        """Episodes in flight: sandbox sessions are scarce, so no more than one update's worth of them."""
        if self.sandbox is None:
            return self.cfg.concurrency
        return max(1, min(self.cfg.concurrency, self.cfg.episodes_per_step))

    # --- the batch -------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def prepare(self, episodes: list[Episode]) -> dict[str, Any]:
        """Tokens, masks, shaped rewards, old log-probs, values, advantages and returns for a batch, all (B, T−1)
        and aligned with the predicted tokens."""
        cfg = self.cfg
        samples = [self.renderer.render(e) for e in episodes]
        shaped = [cfg.shaping.apply(s) for s in samples]
        batch = {k: v.to(self.device) for k, v in collate(samples, self.tokenizer.pad_token_id).items()}
        if "pixel_values" in batch:  # which images are whose, so minibatches can take their rows' images along
            counts = [0 if s.image_grid_thw is None else int(s.image_grid_thw.shape[0]) for s in samples]
            batch["image_counts"] = torch.tensor(counts, device=self.device)
        mask = batch["loss_mask"][:, 1:]
        rewards = batch["rewards"][:, 1:].clone()
        batch["mask"] = mask
        kl = torch.zeros_like(mask)
        layout = self._packing(batch)
        inputs = batch if layout is None else packing.pack(batch, layout)

        def per_token(values: torch.Tensor) -> torch.Tensor:
            return values if layout is None else packing.unpack(values, layout)

        if self.train_actor or cfg.kl_coef > 0:  # value pretraining without KL never looks at the policy's ratios
            old_log_probs = per_token(token_log_probs(self.actor, inputs, only=inputs["mask"])[0])
            batch["old_log_probs"] = old_log_probs
        if cfg.kl_coef > 0:
            batch["ref_log_probs"] = per_token(self._reference_log_probs(inputs))
            kl = algos.kl_penalty(old_log_probs, batch["ref_log_probs"], cfg.kl_estimator) * mask
            if cfg.kl_in == "reward":
                rewards = rewards - cfg.kl_coef * kl
        values = torch.zeros_like(mask)
        if self.critic is not None:
            values = per_token(self.critic(**model_inputs(inputs))[:, :-1]) * mask
        lam_policy: float | torch.Tensor = cfg.lam_policy
        if cfg.length_adaptive:
            lam_policy = algos.length_adaptive_lambda(mask, cfg.alpha)
        # value pretraining fits Monte-Carlo targets (λ = 1), whatever λ_critic says
        lam_critic = cfg.lam_critic if self.train_actor else 1.0
        advantages, returns = algos.decoupled_gae(rewards, values, mask, gamma=cfg.gamma, lam_critic=lam_critic,
                                                  lam_policy=lam_policy)  # fmt: skip
        if cfg.advantage != "gae":
            outcomes = torch.tensor([episode_return(e) for e in episodes], device=self.device)
            groups = torch.tensor([int(e.meta.get("seed", i)) for i, e in enumerate(episodes)], device=self.device)
            if cfg.advantage == "grpo":
                per_episode = algos.grpo_advantages(outcomes, groups)
            else:
                per_episode = algos.pass_at_k_advantages(outcomes, groups, cfg.pass_k)
            advantages = algos.broadcast_to_tokens(per_episode, mask)
        elif cfg.normalize_advantages:
            m = mask.bool()
            advantages = (advantages - advantages[m].mean()) / (advantages[m].std() + 1e-8) * mask
        batch.update(rewards=rewards, values=values, advantages=advantages, returns=returns, kl=kl)
        turns = [e.turns for e in episodes]
        scores = [e.meta["info"]["score"] for e in episodes if "score" in e.meta.get("info", {})]
        lengths = [int(s.loss_mask.sum()) for s in samples]
        batch["stats"] = {
            "reward": sum(episode_return(e) for e in episodes) / len(episodes),
            "turns": sum(turns) / len(turns),
            "response_tokens": sum(lengths) / max(sum(turns), 1),
            "truncated": sum(1 for e in episodes for m in e.messages if m.get("truncated")) / max(sum(turns), 1),
            "staleness": sum(self.staleness_of(e) for e in episodes) / len(episodes),
            **{f"shaping_{k}": sum(s[k] for s in shaped) / len(shaped) for k in shaped[0]},
            "kl": float((kl * mask).sum() / mask.sum().clamp(min=1)),
        }
        if scores:  # sandbox tasks: the share the evaluator passed
            batch["stats"]["success_rate"] = sum(1 for s in scores if s >= 1.0) / len(scores)
        return batch

    def _packing(self, batch: dict[str, Any]) -> packing.Packing | None:
        """How a batch's sequences share rows, or None to keep it padded (packing off, or images in the batch)."""
        if not self.pack or "pixel_values" in batch:
            return None
        return packing.plan(batch["attention_mask"])

    def staleness_of(self, episode: Episode) -> int:
        """How many versions behind the trainer the oldest turn of an episode was generated."""
        versions = [m.get("version", self.version) for m in episode.messages if m["role"] == "assistant"]
        return self.version - min(versions, default=self.version)

    def _reference_log_probs(self, batch: dict[str, Any]) -> torch.Tensor:
        if self.reference is not None:
            return token_log_probs(self.reference, batch, only=batch["mask"])[0]
        with self.actor.disable_adapter():  # LoRA: the base model is the reference, no second copy
            return token_log_probs(self.actor, batch, only=batch["mask"])[0]

    # --- updates ---------------------------------------------------------------------------------------------------

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """ppo_epochs × minibatches optimizer steps on a prepared batch; returns averaged diagnostics."""
        cfg = self.cfg
        size = batch["input_ids"].shape[0]
        sums: dict[str, float] = {}
        count = 0
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(size)
            for part in order.chunk(max(1, min(cfg.minibatches, size))):
                mini = select_rows(batch, part)
                if (layout := self._packing(mini)) is not None:
                    mini = packing.pack(mini, layout)
                tokens = dist.all_sum(float(mini["mask"].sum()))
                for key, value in self._minibatch_step(mini, tokens).items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
        return {k: v / count for k, v in sums.items()}

    def _minibatch_step(self, mini: dict[str, torch.Tensor], global_tokens: float) -> dict[str, float]:
        cfg = self.cfg
        mask = mini["mask"]
        out: dict[str, float] = {}
        if self.train_actor:
            log_probs, entropy = token_log_probs(
                self.actor_ddp, mini, only=mask, entropy=True, entropy_grad=cfg.entropy_coef != 0
            )
            loss, stats = algos.policy_loss(log_probs, mini["old_log_probs"], mini["advantages"], mask,
                                            eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                            dual_clip=cfg.dual_clip or None, global_tokens=global_tokens)  # fmt: skip
            assert entropy is not None
            entropy_mean = algos.token_mean(entropy, mask, global_tokens)
            total = loss - cfg.entropy_coef * entropy_mean
            if cfg.kl_coef > 0 and cfg.kl_in == "loss":
                kl = algos.kl_penalty(log_probs, mini["ref_log_probs"], cfg.kl_estimator)
                total = total + cfg.kl_coef * algos.token_mean(kl, mask, global_tokens)
            (total * self.world).backward()
            out["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.actor.parameters(), cfg.grad_clip))
            with self.policy.lock:  # generation threads never see half-updated weights
                self.optimizers["actor"].step()
            self.optimizers["actor"].zero_grad(set_to_none=True)
            out.update(
                policy_loss=dist.all_sum(float(loss.detach())),
                entropy=dist.all_sum(float(entropy_mean.detach())),
                **stats,
            )
        if self.critic is not None and self.critic_ddp is not None:
            values = self.critic_ddp(**model_inputs(mini))[:, :-1]
            loss_v = algos.value_loss(values, mini["values"], mini["returns"], mask,
                                      clip=cfg.value_clip or None, global_tokens=global_tokens)  # fmt: skip
            (loss_v * self.world).backward()
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.grad_clip)
            self.optimizers["critic"].step()
            self.optimizers["critic"].zero_grad(set_to_none=True)
            out["value_loss"] = dist.all_sum(float(loss_v.detach()))
            out["explained_variance"] = algos.explained_variance(values.detach(), mini["returns"], mask)
        return out

    # --- checkpoints -----------------------------------------------------------------------------------------------

    def _models(self) -> dict[str, torch.nn.Module]:
        models: dict[str, torch.nn.Module] = {"actor": self.actor} if self.train_actor else {}
        if self.critic is not None:
            models["critic"] = self.critic
        return models

    def save(self, step: int) -> None:
        if self.rank == 0:
            checkpoints.save(self.out, step, models=self._models(), optimizers=self.optimizers,
                             state={"version": self.version, "config": _jsonable(asdict(self.cfg) | SECRETS)},
                             keep=self.cfg.keep)  # fmt: skip
        dist.barrier()

    def resume(self) -> int:
        found = checkpoints.latest(self.out) if self.cfg.resume else None
        if found is None:
            return 0
        state = checkpoints.load(found, models=self._models(), optimizers=self.optimizers)
        self.version = state["version"]
        self.policy.version = self.version
        return int(state["step"])

    # --- the loops -------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        """PPO (train_actor) or value pretraining (critic only, stops once settled). Returns the last metrics."""
        cfg = self.cfg
        stage = "ppo" if self.train_actor else "value"
        limit = cfg.iterations if self.train_actor else cfg.value_max_steps
        step = self.resume()
        logger = MetricsLogger(self.out, enabled=self.rank == 0)
        bar = tqdm(total=limit, initial=step, desc=stage, unit="it", disable=self.rank != 0 or not cfg.progress)
        metrics: dict[str, float] = {}
        settled = 0
        failed = 0
        previous_loss = math.inf
        pool = None
        if cfg.streaming:
            pool = RolloutPool(self.env_factory, self.policy, batch_size=cfg.episodes_per_step,
                               concurrency=self.concurrency(), max_staleness=cfg.max_staleness,
                               max_turns=cfg.max_turns, seeds=self.seeds())  # fmt: skip
            pool.staleness.version = self.version
            pool.__enter__()
        seeds = self.seeds()
        try:
            while step < limit:
                started = time.perf_counter()
                if pool is not None:
                    episodes = pool.take(cfg.episodes_per_step)
                else:
                    chosen = [next(seeds) for _ in range(cfg.episodes_per_step)]
                    lost: list[str] = []
                    episodes = collect_sync(self.env_factory, self.policy, chosen, cfg.max_turns, errors=lost)
                    failed += len(lost)
                rollout_s = time.perf_counter() - started
                batch = self.prepare(episodes)
                stats = batch.pop("stats")
                trained = self.update(batch)
                step += 1
                # Each update is a new policy version; in value pretraining the policy is fixed, but counting batches
                # the same way keeps the pool's admission rule moving.
                self.version += 1
                if pool is not None:
                    pool.set_version(self.version)
                else:
                    self.policy.version = self.version
                elapsed = time.perf_counter() - started
                tokens = dist.all_sum(float(batch["attention_mask"].sum()))
                metrics = {
                    "total_steps": limit,
                    "loss": trained["policy_loss"] if self.train_actor else trained["value_loss"],
                    **stats,
                    **trained,
                    "rollout_s": rollout_s,
                    "step_s": elapsed,
                    "tokens_per_s": tokens / elapsed,
                    "episodes_per_s": len(episodes) * self.world / elapsed,
                }
                if pool is not None:
                    metrics["dropped_stale"] = pool.stats.dropped_stale
                    failed = pool.stats.failed
                metrics["failed_episodes"] = failed  # episodes lost to their environment so far (a sandbox error)
                logger.log(step, metrics, stage=stage)
                bar.update(1)
                bar.set_postfix(reward=f"{stats['reward']:.3f}", ev=f"{trained.get('explained_variance', 0):.2f}")
                if cfg.save_every and step % cfg.save_every == 0:
                    self.save(step)
                if not self.train_actor:
                    loss = trained["value_loss"]
                    settled = settled + 1 if abs(previous_loss - loss) <= cfg.value_settle_tol * loss else 0
                    previous_loss = loss
                    if settled >= cfg.value_settle_patience:
                        break
        finally:  # no new episode, then every sandbox session given back: threads still playing find theirs gone
            if pool is not None:
                pool.stop()
            self.close_envs()
            if pool is not None:
                pool.close()
            self.close_envs()  # and whatever a thread leased meanwhile
            bar.close()
            logger.close()
        self.save(step)
        if self.rank == 0:
            if self.train_actor:
                save_actor(self.actor, self.tokenizer, self.processor, self.out / "final")
            if self.critic is not None:
                self.critic.save_pretrained(self.out / "critic")
        dist.barrier()
        return {"step": step, **metrics}


def select_rows(batch: dict[str, Any], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of a prepared batch for some of its episodes, in `rows` order; with images, those episodes'
    images (`image_grid_thw` rows) and their patches (`pixel_values` rows), which the model reads in row order."""
    vision = ("pixel_values", "image_grid_thw", "image_counts")
    mini = {k: v[rows] for k, v in batch.items() if isinstance(v, torch.Tensor) and k not in vision}
    if "pixel_values" not in batch:
        return mini
    counts, grid = batch["image_counts"].cpu(), batch["image_grid_thw"]
    patches = grid.prod(-1).cpu()
    first_image = torch.cumsum(counts, 0) - counts
    first_patch = torch.cumsum(patches, 0) - patches
    images = [i for r in rows.tolist() for i in range(int(first_image[r]), int(first_image[r] + counts[r]))]
    if not images:  # episodes without screenshots: a text-only minibatch
        return mini
    spans = [torch.arange(int(first_patch[i]), int(first_patch[i] + patches[i])) for i in images]
    mini["pixel_values"] = batch["pixel_values"][torch.cat(spans).to(batch["pixel_values"].device)]
    mini["image_grid_thw"] = grid[torch.tensor(images, device=grid.device)]
    mini["image_counts"] = counts[rows.cpu()].to(grid.device)
    return mini


SECRETS = {"sandbox_api_key": ""}  # options never written into a checkpoint's state


def adamw(params: Any, lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay, on torch's fused kernel when every parameter is a float tensor on the CPU or a
    CUDA device (the models are moved there before this): one kernel per step over all tensors instead of the plain
    loop's ~10 small ops per tensor. Same update rule; on 2 CPU cores a step of the 2.4M-parameter tiny model takes
    1.3 ms instead of 4.4 ms, and stays cheap when the cores are oversubscribed (bench/ppo_vs_trl.py)."""
    params = list(params)
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=fused or None)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value if isinstance(value, (int, float, str, bool, type(None), list)) else str(value)


def train_ppo(cfg: PPOConfig) -> dict[str, float]:
    return PPOTrainer(cfg).run()


def pretrain_value(cfg: PPOConfig) -> dict[str, float]:
    """Value pretraining (VC-PPO, UI-TARS-2 2.5.4): fit the critic under the fixed policy until it settles; the
    critic lands in `<out>/critic`, which `PPOConfig.critic` then points at."""
    return PPOTrainer(cfg, train_actor=False).run()
