"""Per-rank memory of a data-parallel step, by arithmetic: the single-process analytic estimate at the per-rank
micro-batch, adjusted for what DDP or FSDP2 adds and shards.

* DDP: every parameter and optimizer state is replicated; the reducer allocates bucket storage the size of the
  gradients at construction and keeps it. Without ``gradient_as_bucket_view`` the gradients are a second copy
  (the bucket adds the gradients' bytes at every moment); with it the gradients are views into the buckets, so
  the bucket replaces them (no extra copy).
* FSDP2: parameters, gradients and optimizer state are sharded 1/N (up to the padding of dim 0 to a multiple of
  N). In flight, unsharded: the root's parameters (embeddings, ln_f, lm_head) from the forward to the end of
  backward; with ``reshard_after_forward`` the blocks' full parameters only while they run (in backward the
  current block, the next one's flat all-gather buffer in flight beside it), without it every block's full
  parameters from its forward to the end of backward; one block's flat all-gather buffer at the end of the
  forward, and in backward where a resharded block is gathered again; with resharding, in backward the root's and
  one block's gradients, unsharded until their reduce-scatter. The peak is the largest of three moments, each so
  adjusted: the forward's end, backward's start (the forward's end with backward's first gradients) and the
  single-process peak.

Measured against the tracker (which follows FSDP2's storage resizes and runs collectives in program order, so
its peak is the same on every run): DDP matches to 8 bytes and FSDP2 without resharding to FSDP2's dim-0 padding
(at most one row per parameter per rank). With resharding the estimate is an upper bound: it places one unsharded
block and the next one's buffer at the start of backward, where every activation is still live, while the real
peak comes inside the last block's backward, after part of that block's activations is freed. That holds at 2
ranks and at 4 (FSDP2, and HSDP's 2 replicas x 2 shards), where a micro-batch of 2 rows puts the single-process
peak in the optimizer step but the sharded one in backward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gptcore.config import FSDP2Options, Parallel
from gptcore.memory.analytic import Estimate, Question, estimate, param_shapes
from gptcore.memory.categories import GRADIENTS, OPTIMIZER_STATE, PARAMETERS


@dataclass(frozen=True)
class RankEstimate:
    """The analytic peak of one rank's training step and how it was adjusted from one process's."""

    total_bytes: int
    world_size: int
    single: Estimate
    """The single-process estimate at the per-rank micro-batch (what one rank computes)."""
    adjustments: dict[str, int]
    """What DDP or FSDP2 adds (positive) or shards away (negative), in bytes at the peak."""


def estimate_per_rank(question: Question, world_size: int) -> RankEstimate:
    """Per-rank peak of ``question`` (a parallel recipe, its global batch) on ``world_size`` ranks."""
    cfg, recipe = question.cfg, question.recipe
    if world_size < 1:
        raise ValueError(f"world_size: must be >= 1, got {world_size}")
    per_rank = recipe.micro_batch(cfg, world_size) * recipe.grad_accum_steps
    local = dataclasses.replace(
        question,
        cfg=dataclasses.replace(cfg, batch_size=per_rank * recipe.batch_divisor),
        recipe=dataclasses.replace(recipe, parallel=Parallel()),
    )
    single = estimate(local)
    grads = single.states[GRADIENTS]
    adjust: dict[str, int] = {}
    if recipe.parallel.ddp is not None:
        if recipe.parallel.ddp.gradient_as_bucket_view:
            adjust["buckets (the gradients are views into them)"] = grads - single.by_category.get(GRADIENTS, 0)
        else:
            adjust["buckets"] = grads
    elif recipe.parallel.fsdp2 is not None:
        return _fsdp2(question, world_size, single, recipe.parallel.fsdp2)
    total = single.total_bytes + sum(adjust.values())
    return RankEstimate(total_bytes=total, world_size=world_size, single=single, adjustments=adjust)


def _fsdp2(question: Question, world_size: int, single: Estimate, options: FSDP2Options) -> RankEstimate:
    """The larger of two moments: the forward's end and the single-process peak (early in backward)."""
    cfg, recipe = question.cfg, question.recipe
    n = world_size // options.replicate  # HSDP: each rank holds 1/shard of the states, the shard group's share
    pbytes = single.states[PARAMETERS] // single.num_params
    block = pbytes * sum(numel for name, numel, _ in param_shapes(cfg, recipe) if name.startswith("transformer.h.0."))
    root = single.states[PARAMETERS] - cfg.n_layer * block
    # resharded blocks are unsharded one at a time (the next one's all-gather buffer in flight beside it)
    blocks = cfg.n_layer if not options.reshard_after_forward else 1
    moments = {}
    # backward's start differs from the forward's end only where blocks were resharded (see below)
    backward = [("backward", single.at_forward_end)] if options.reshard_after_forward else []
    for moment, live in [("forward end", single.at_forward_end), *backward, ("peak", single.by_category)]:
        adjust = {
            f"{c} sharded 1/{n}": -round(live.get(c, 0) * (1 - 1 / n)) for c in (PARAMETERS, OPTIMIZER_STATE, GRADIENTS)
        }
        adjust["root parameters unsharded"] = root
        adjust[f"{blocks} block(s) of parameters unsharded"] = blocks * block
        if moment != "peak" or options.reshard_after_forward:  # backward gathers again only after a reshard
            adjust["one block's all-gather buffer"] = block
        if moment == "backward":
            # backward's first gradients, unsharded until their reduce-scatter: the root's (reduced at the end of
            # backward) and the block being differentiated, while every activation is still counted live
            adjust["root gradients unsharded"] = root
            adjust["one block's gradients unsharded"] = block
        moments[moment] = (sum(live.values()) + sum(adjust.values()), adjust)
    total, adjust = max(moments.values(), key=lambda m: m[0])
    return RankEstimate(total_bytes=total, world_size=world_size, single=single, adjustments=adjust)
