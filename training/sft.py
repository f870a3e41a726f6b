"""Continual pre-training (CT) and supervised fine-tuning (SFT) on episode stores (UI-TARS-2 2.4).

SFT trains only the model's own turns (the loss mask of `training.data.Renderer`); CT trains every token. The loss is
the token mean over the global batch, split across ranks by length and into micro-batches (gradient accumulation),
so the result does not depend on the number of processes or the micro-batch size. Checkpoints resume exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from training import checkpoints, dist, packing
from training.data import Episode, Renderer, collate, read_episodes
from training.metrics import MetricsLogger
from training.models import LoraSettings, load_actor, load_tokenizer, save_actor, token_log_probs


@dataclass
class SFTConfig:
    """Every option of a CT/SFT run (the CLI exposes each as --flag)."""

    model: str  # checkpoint directory to start from
    data: str  # episodes: a .jsonl(.gz) file or a directory of them
    out: str  # run directory: checkpoints, metrics.jsonl, tb/, final/
    mode: str = "sft"  # "sft": loss on the model's turns only; "ct": on every token
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0  # linear warm-up, then constant
    epochs: int = 1
    max_steps: int = 0  # 0: until the data (× epochs) is used up
    batch_episodes: int = 16  # global batch: episodes per optimizer step, over all ranks
    micro_batch: int = 4  # episodes per forward pass on one rank (gradient accumulation over the rest)
    max_length: int = 4096  # tokens per episode; longer ones are cut
    grad_clip: float = 1.0
    save_every: int = 0  # optimizer steps between checkpoints (0: only at the end)
    keep: int = 2  # checkpoints kept
    resume: bool = False  # continue from the run directory's latest checkpoint
    seed: int = 0
    # Each epoch in a seeded order that depends only on the episodes' content, not on how the store is laid out (which
    # is by trajectory id, i.e. by when concurrent annotators happened to start): the same data trains the same model.
    shuffle: bool = False
    lora: LoraSettings = field(default_factory=LoraSettings)
    pack: bool = True  # padding-free micro-batches (training.packing); text-only batches
    progress: bool = True


def content_key(episode: Episode) -> str:
    """A digest of what an episode says (instruction, reward, every turn's text), not of where it is stored: two
    exports of the same trajectories name their images after different trajectory ids."""
    turns = [
        (m["role"], m["content"] if isinstance(m["content"], str) else [p.get("text", "") for p in m["content"]])
        for m in episode.messages
    ]
    text = json.dumps([episode.instruction, episode.reward, turns], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def episode_batches(
    path: str, size: int, epochs: int, skip: int, shuffle_seed: int | None = None
) -> Iterator[list[Episode]]:
    """Global batches, epoch after epoch, after skipping `skip` already-trained episodes: in file order, or with
    `shuffle_seed` sorted by `content_key` and permuted anew each epoch from (seed, epoch), so the order depends on
    the data alone and a resumed run goes on with the same sequence. Shuffling holds the episodes in memory."""
    canonical = None if shuffle_seed is None else sorted(read_episodes(path), key=content_key)

    def epoch_order(epoch: int) -> Iterator[Episode]:
        if canonical is None:
            return read_episodes(path)
        order = list(range(len(canonical)))
        random.Random(f"{shuffle_seed}:{epoch}").shuffle(order)
        return (canonical[i] for i in order)

    seen = 0
    batch: list[Episode] = []
    for epoch in range(epochs):
        for episode in epoch_order(epoch):
            seen += 1
            if seen <= skip:
                continue
            batch.append(episode)
            if len(batch) == size:
                yield batch
                batch = []
    if batch:
        yield batch


def masked_nll_sum(model: Any, batch: dict[str, torch.Tensor], *, pack: bool = True) -> torch.Tensor:
    """Σ −log π over the trained tokens of a micro-batch (text batches in padding-free rows when `pack`)."""
    batch = dict(batch, mask=batch["loss_mask"][:, 1:])
    if pack and "pixel_values" not in batch:  # text: padding-free rows (training.packing)
        batch = packing.pack(batch, packing.plan(batch["attention_mask"]))
    log_probs, _ = token_log_probs(model, batch, only=batch["mask"])
    return -(log_probs * batch["mask"]).sum()


def train_sft(cfg: SFTConfig, on_step: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Runs CT/SFT; returns the last step's metrics. Rank 0 writes metrics, checkpoints and `final/`, and calls
    `on_step(step, metrics)` after each step (for a caller's own progress display)."""
    rank, world = dist.init()
    if cfg.batch_episodes < world:
        raise ValueError(f"batch_episodes ({cfg.batch_episodes}) must be at least the number of processes ({world})")
    torch.manual_seed(cfg.seed)
    device = dist.device()
    out = Path(cfg.out)
    tokenizer, processor = load_tokenizer(cfg.model)
    renderer = Renderer(tokenizer, image_processor=processor, mode=cfg.mode, max_length=cfg.max_length)
    model = load_actor(cfg.model, cfg.lora).to(device)
    pack = packing.usable(cfg.pack, model, len(tokenizer))
    model.train()
    trained = dist.wrap(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                  weight_decay=cfg.weight_decay)  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)))
    step, consumed = 0, 0
    if cfg.resume and (found := checkpoints.latest(out)) is not None:
        state = checkpoints.load(found, models={"model": model}, optimizers={"model": optimizer})
        step, consumed = state["step"], state["consumed"]
        schedule.last_epoch = step
    # One full pass before training: it counts the steps and fails fast on a bad line, not hours into the run.
    total = sum(1 for _ in read_episodes(cfg.data)) * cfg.epochs
    planned = math.ceil(total / cfg.batch_episodes)
    if cfg.max_steps:
        planned = min(planned, cfg.max_steps)
    logger = MetricsLogger(out, enabled=rank == 0)
    bar = tqdm(total=planned, initial=step, desc=cfg.mode, disable=rank != 0 or not cfg.progress, unit="step")
    metrics: dict[str, Any] = {}
    for episodes in episode_batches(
        cfg.data, cfg.batch_episodes, cfg.epochs, consumed, cfg.seed if cfg.shuffle else None
    ):
        if step >= planned:
            break
        started = time.perf_counter()
        samples = [renderer.render(e) for e in episodes]
        mine = [samples[i] for i in dist.shard([len(s) for s in samples], rank, world)]
        global_tokens = dist.all_sum(sum(float(s.loss_mask[1:].sum()) for s in mine))
        chunks = [mine[i : i + cfg.micro_batch] for i in range(0, len(mine), cfg.micro_batch)]
        nll = 0.0
        for n, chunk in enumerate(chunks):
            sync = n == len(chunks) - 1 or world == 1
            with contextlib.nullcontext() if sync else trained.no_sync():
                batch = {k: v.to(device) for k, v in collate(chunk, tokenizer.pad_token_id).items()}
                loss_sum = masked_nll_sum(trained, batch, pack=pack)
                # DDP averages gradients over ranks; × world makes it the gradient of the global token mean.
                (loss_sum * world / max(global_tokens, 1.0)).backward()
                nll += float(loss_sum.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        consumed += len(episodes)
        elapsed = time.perf_counter() - started
        metrics = {
            "total_steps": planned,
            "loss": dist.all_sum(nll) / max(global_tokens, 1.0),
            "trained_tokens": global_tokens,
            "grad_norm": grad_norm,
            "lr": schedule.get_last_lr()[0],
            "tokens_per_s": global_tokens / elapsed,
            "episodes": consumed,
        }
        logger.log(step, metrics, stage=cfg.mode)
        if on_step is not None and rank == 0:
            on_step(step, metrics)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        if cfg.save_every and step % cfg.save_every == 0:
            if rank == 0:
                checkpoints.save(out, step, models={"model": model}, optimizers={"model": optimizer},
                                 state={"consumed": consumed}, keep=cfg.keep)  # fmt: skip
            dist.barrier()
    bar.close()
    if rank == 0:
        checkpoints.save(out, step, models={"model": model}, optimizers={"model": optimizer},
                         state={"consumed": consumed}, keep=cfg.keep)  # fmt: skip
        save_actor(model, tokenizer, processor, out / "final")
    logger.close()
    dist.barrier()
    return {"step": step, **metrics}
