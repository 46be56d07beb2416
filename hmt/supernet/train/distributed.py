"""Data parallelism over several GPUs (torchrun): process group set-up and one coalesced
gradient all-reduce per step.

Gradients are averaged by hand rather than through DistributedDataParallel because each
step runs several different subnets and per-block distillation calls; every rank samples
the same subnets (same seeds), so parameters a step did not use are left out on every rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_kind: str) -> DistContext:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistContext(0, 1, 0)
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")
    return DistContext(rank, world_size, local_rank)


def all_reduce_gradients(params: list[torch.nn.Parameter], ctx: DistContext) -> None:
    if not ctx.enabled:
        return
    import torch.distributed as dist

    # Every rank samples the same subnets (same seeds), so the parameters a step left without
    # a gradient are the same on every rank: they stay out of the reduction, and stay without a
    # gradient, as on one device (SGD then neither decays nor moves them).
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= ctx.world_size
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def broadcast_state(model: torch.nn.Module, ctx: DistContext) -> None:
    """Make every rank start from rank 0's weights and buffers."""
    if not ctx.enabled:
        return
    import torch.distributed as dist

    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=0)
