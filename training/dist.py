"""Data parallelism for the trainers: one process per device under `torchrun` (gloo on CPU, NCCL on GPUs).

Every rank reads the same global batch order; `shard` gives each rank its part, balanced by Karmarkar–Karp on a
length-based workload, and losses divide by the *global* token count so that N processes compute exactly the loss
(and, after DDP's gradient mean is undone, the gradient) of one process on the whole batch.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from training.balance import karmarkar_karp, workload


def init() -> tuple[int, int]:
    """(rank, world size); starts the process group when launched by torchrun with more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def all_sum(value: float) -> float:
    """Sum of a number over all ranks (the number itself with one process)."""
    if not dist.is_initialized():
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor.item())


def shard(lengths: list[int], rank: int, world: int) -> list[int]:
    """The indices of the global batch this rank trains on, balanced by estimated work (same answer on every rank)."""
    if world == 1:
        return list(range(len(lengths)))
    groups = karmarkar_karp([workload(n) for n in lengths], world)
    return sorted(groups[rank])


def wrap(model: torch.nn.Module) -> Any:
    """DDP around the model when several processes train; the model itself otherwise."""
    if not dist.is_initialized():
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, find_unused_parameters=False)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def finish() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
