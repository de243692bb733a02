"""Data-parallel training with torchrun: which rank this is, and the process group.

    torchrun --standalone --nproc_per_node=2 -m pe_bench.cli pe=rope train.device=cpu

``train.batch_size`` stays the global batch: every rank samples the same global batch from the
same seeded generator and trains on its own slice of it, so the data order (and, up to float
reduction order, the result) is that of a single process. Rank 0 alone writes checkpoints,
records and reports; the other ranks stop after training. Under SLURM, hydra-submitit-launcher
with ``tasks_per_node`` > 1 sets the same environment variables (see README).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pe_bench.errors import UserError


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The rank that writes files and evaluates."""
        return self.rank == 0

    def batch_slice(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size``."""
        if batch_size % self.size:
            raise UserError(
                f"train.batch_size={batch_size} must be divisible by the {self.size} processes"
            )
        per_rank = batch_size // self.size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over all ranks (the global-batch loss from per-rank losses)."""
        if self.size == 1:
            return value
        value = value.detach().clone()
        dist.all_reduce(value)
        return value / self.size


def current_world(device_type: str) -> World:
    """The world torchrun (or SLURM via submitit) started this process in; one process if none.

    Initialises the process group on first use: gloo on CPU, NCCL on CUDA.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def rank_from_env() -> int:
    """This process's rank before any process group exists (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))
