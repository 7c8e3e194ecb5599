"""Distributed data parallel set-up from ``torchrun``'s environment (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: torch.device) -> DistInfo:
    """Join the process group when launched by torchrun (``WORLD_SIZE`` > 1); a no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return info


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)  # DDP
    return getattr(model, "_orig_mod", model)  # torch.compile


def replicas_agree(model: nn.Module, dist_info) -> dict:
    """DDP keeps replicas in sync; verify it rather than assume it: the largest parameter difference across ranks."""
    flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in unwrap(model).parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist_info.world_size)]
    torch.distributed.all_gather(gathered, flat)
    return {
        "world_size": dist_info.world_size,
        "backend": torch.distributed.get_backend(),
        "max_param_diff_across_ranks": max((g - gathered[0]).abs().max().item() for g in gathered),
    }
