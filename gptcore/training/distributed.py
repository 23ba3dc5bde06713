"""Data parallelism as torchrun and torch.distributed provide it: the process group from torchrun's environment,
DDP or FSDP2 wrapping, gradient sync only on the last micro-batch, the rank's shard of a batch, and the loss
averaged over ranks. No launcher and no collective of our own.

The batch stays global: a rank trains on rows ``[rank * m, (rank + 1) * m)`` of each single-process micro-batch
(``m`` = micro-batch / world size), so the union over ranks is the single-process batch, and DDP's (or FSDP2's)
average of the ranks' gradients is the single-process gradient.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from gptcore.config import Recipe

#: How long a collective waits for the other ranks before it raises: a peer that is gone ends the job, never
#: hangs it (torchrun also stops the other workers as soon as one exits non-zero).
TIMEOUT = timedelta(minutes=5)


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the job, from torchrun's RANK, WORLD_SIZE and LOCAL_RANK."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """True under torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def this_rank() -> Rank:
    """This process's Rank (rank 0 of 1 when not launched by torchrun)."""
    if not launched():
        return Rank()
    return Rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0")))


def init(device: torch.device) -> tuple[Rank, torch.device]:
    """Join torchrun's process group (once per process: gloo on CPU, nccl on CUDA, a finite timeout) and return
    the rank and the device it trains on (cuda:LOCAL_RANK on a GPU). ValueError when not launched by torchrun."""
    if not launched():
        raise ValueError(
            "parallel: a DDP/FSDP2 recipe runs under torchrun, e.g. torchrun --nproc-per-node=2 "
            "-m gptcore train --model cpu-small --recipe ddp"
        )
    rank = this_rank()
    if device.type == "cuda":
        device = torch.device("cuda", rank.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            timeout=TIMEOUT,
            device_id=device if device.type == "cuda" else None,
        )
        atexit.register(shutdown)
    return rank, device


def shutdown() -> None:
    """Destroy the process group (registered at exit by ``init``)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, recipe: Recipe, device: torch.device) -> nn.Module:
    """Wrap a gptcore GPT for ``recipe.parallel``: DDP returns the wrapper (call it for forward); FSDP2 shards the
    model in place (fully_shard on each block, then on the root, which holds the embeddings, ln_f and lm_head)
    and returns it, over all ranks or, for HSDP (``replicate`` > 1), within each replica on a 2-D mesh."""
    ddp, fsdp2 = recipe.parallel.ddp, recipe.parallel.fsdp2
    if ddp is not None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=ddp.bucket_cap_mb,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        )
    if fsdp2 is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        world, replicate = dist.get_world_size(), fsdp2.replicate
        if world % replicate:
            raise ValueError(f"parallel.fsdp2.replicate={replicate}: a world of {world} ranks does not divide by it")
        mesh = (  # HSDP: replicate across dim 0, shard within dim 1
            init_device_mesh(device.type, (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))
            if replicate > 1
            else init_device_mesh(device.type, (world,))
        )
        low = fsdp2.param_dtype == "bf16"
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if low else None, reduce_dtype=torch.float32 if low else None
        )
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, reshard_after_forward=fsdp2.reshard_after_forward, mp_policy=policy)
        fully_shard(model, mesh=mesh, reshard_after_forward=fsdp2.reshard_after_forward, mp_policy=policy)
        return model
    raise ValueError(f"parallel: nothing to wrap for {recipe.parallel.mode!r}")


def gradient_sync(wrapped: nn.Module, recipe: Recipe, last: bool) -> contextlib.AbstractContextManager:
    """Reduce gradients over ranks only on the last micro-batch: DDP's no_sync before it, FSDP2's
    set_requires_gradient_sync(False) before it and True on it."""
    if recipe.parallel.ddp is not None:
        return contextlib.nullcontext() if last else wrapped.no_sync()
    if recipe.parallel.fsdp2 is not None:
        wrapped.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def shard(batch: tuple[torch.Tensor, torch.Tensor], rank: Rank) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of a single-process micro-batch: a function of (step, rank) only, and the union over ranks
    is the whole micro-batch."""
    x, y = batch
    m = x.size(0) // rank.world_size
    rows = slice(rank.rank * m, (rank.rank + 1) * m)
    return x[rows], y[rows]


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """The mean of a 0-dim tensor over ranks (gloo has no AVG: sum, then divide)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def max_over_ranks(values: list[float]) -> list[float]:
    """Elementwise max of a list of floats over ranks (the slowest rank sets a step's time)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()
