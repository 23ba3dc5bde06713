"""Recipe.parallel: data parallelism under torchrun, DDP or FSDP2 with their options, or neither."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from gptcore.config.checks import check, choose

ParallelMode = Literal["none", "ddp", "fsdp2"]
PARALLELS: tuple[ParallelMode, ...] = get_args(ParallelMode)
FSDPParamDtype = Literal["bf16"]


@dataclass(frozen=True, kw_only=True)
class DDPOptions:
    """DistributedDataParallel's options (its own argument names)."""

    gradient_as_bucket_view: bool = False
    """Gradients are views into the all-reduce buckets (no second copy of the gradients)."""
    bucket_cap_mb: float = 25.0
    """All-reduce bucket size in MiB (DDP's default)."""

    def __post_init__(self) -> None:
        check(
            self.gradient_as_bucket_view in (True, False),
            "parallel.ddp.gradient_as_bucket_view",
            "must be true or false",
        )
        check(0 < self.bucket_cap_mb < math.inf, "parallel.ddp.bucket_cap_mb", "must be a finite number > 0")


@dataclass(frozen=True, kw_only=True)
class FSDP2Options:
    """FSDP2's options: fully_shard's resharding and its MixedPrecisionPolicy."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (gather again in backward)."""
    param_dtype: FSDPParamDtype | None = None
    """MixedPrecisionPolicy's compute dtype (fp32 reductions and master shards); None: fp32. Needs precision fp32."""
    replicate: int = 1
    """HSDP: shard within groups of world / replicate ranks and replicate across ``replicate`` such groups, FSDP2 on a
    2-D device mesh (torchtitan's data_parallel_replicate_degree x data_parallel_shard_degree). 1: plain FSDP2."""

    def __post_init__(self) -> None:
        check(
            self.reshard_after_forward in (True, False), "parallel.fsdp2.reshard_after_forward", "must be true or false"
        )
        check(
            isinstance(self.replicate, int) and self.replicate >= 1, "parallel.fsdp2.replicate", "must be an int >= 1"
        )
        dtypes = get_args(FSDPParamDtype)
        check(
            self.param_dtype is None or self.param_dtype in dtypes,
            "parallel.fsdp2.param_dtype",
            f"unknown {self.param_dtype!r}; choose None or {choose(dtypes)}",
        )


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """Data parallelism under torchrun: DDP or FSDP2 with its options, or neither. The batch stays global."""

    ddp: DDPOptions | None = None
    """DDP: replicated weights, gradients all-reduced in buckets. None: not DDP."""
    fsdp2: FSDP2Options | None = None
    """FSDP2: fully_shard per block, then the root; parameters, gradients, optimizer state 1/N. None: not FSDP2."""

    def __post_init__(self) -> None:
        check(
            self.ddp is None or isinstance(self.ddp, DDPOptions),
            "parallel.ddp",
            f"must be DDPOptions or None, got {self.ddp!r}",
        )
        check(
            self.fsdp2 is None or isinstance(self.fsdp2, FSDP2Options),
            "parallel.fsdp2",
            f"must be FSDP2Options or None, got {self.fsdp2!r}",
        )
        check(self.ddp is None or self.fsdp2 is None, "parallel", "DDP and FSDP2 at once; choose one")

    @property
    def mode(self) -> ParallelMode:
        """Which one: none, ddp or fsdp2."""
        return "ddp" if self.ddp is not None else "fsdp2" if self.fsdp2 is not None else "none"
