"""The tokens that tokens/s and MFU divide by: one optimizer step of every registered recipe consumes exactly the
global batch x the context length, gradient accumulation, batch divisors and the world size included. A miscount
here would move every speed figure and MFU, and on CPU (where speed is not gated) nothing else would catch it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptcore.config import CUDA_ATTENTION, GPTConfig, Kernels, Parallel
from gptcore.measure.runner import CaseRunner
from gptcore.presets import RECIPES
from gptcore.training import distributed
from gptcore.training.trainer import Trainer
from tests.helpers import TINY

pytestmark = pytest.mark.cpu

# batch 16 divides by every recipe's divisor x accumulation x 2 ranks (at most 4 x 4 x 2 = 32 rows: see the check)
CFG = dataclasses.replace(TINY, batch_size=16)


def tokens_of_one_step(cfg: GPTConfig, recipe_name: str) -> int:
    """Tokens the model reads in one optimizer step, counted at its input (world size 1). Compilation, data
    parallelism and the CUDA-only kernels (TF32, pinned attention, liger, FP8) are switched off: none changes which
    batches a step draws, the CUDA ones cannot run here, and compiling every compiled recipe would take minutes."""
    recipe = RECIPES[recipe_name]
    recipe = dataclasses.replace(
        recipe,
        compile=False,
        memory_budget=None,
        compile_scope="model",
        compile_mode="default",
        kernels=Kernels(),  # liger's and torchao's kernels: GPU-only, and they change no batch
        parallel=Parallel(),
        precision="fp32" if recipe.precision == "tf32" else recipe.precision,
        attention="sdpa" if recipe.attention in CUDA_ATTENTION else recipe.attention,
    )
    trainer = Trainer(cfg, recipe, "cpu")
    seen: list[int] = []
    trainer.model.register_forward_pre_hook(lambda module, args: seen.append(args[0].numel()))
    trainer.step()
    return sum(seen)


@pytest.mark.parametrize("recipe_name", sorted(RECIPES))
def test_one_step_reads_the_global_batch_times_the_context(recipe_name: str) -> None:
    recipe = RECIPES[recipe_name]
    expected = recipe.batch_size(CFG) * CFG.block_size  # the global batch: the model's batch / batch_divisor
    assert recipe.tokens_per_step(CFG) == expected
    assert tokens_of_one_step(CFG, recipe_name) == expected  # every recipe, the CUDA-only ones' kernels swapped
    for world in (1, 2):  # every rank's shard of every micro-batch, summed over ranks, is the global batch
        micro = recipe.micro_batch(CFG, world)
        rows = torch.arange(micro * world).unsqueeze(1)
        per_rank = [
            distributed.shard((rows, rows), distributed.Rank(rank=r, world_size=world))[0].size(0) for r in range(world)
        ]
        assert per_rank == [micro] * world
        assert sum(per_rank) * recipe.grad_accum_steps * CFG.block_size == expected


def test_the_measurement_divides_by_the_same_tokens() -> None:
    for name in ("ckpt-grad-accum-2", "small-batch", "grad-accum", "fp32"):
        runner = CaseRunner(CFG, RECIPES[name], "cpu", warmup=0, steps_per_round=1)
        assert runner.m.tokens_per_step == tokens_of_one_step(CFG, name)


def test_a_planted_miscount_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # planted: tokens per step counted from one micro-batch instead of the whole step
    monkeypatch.setattr(
        type(RECIPES["grad-accum"]), "tokens_per_step", lambda self, model: self.micro_batch(model) * model.block_size
    )
    runner = CaseRunner(CFG, RECIPES["grad-accum"], "cpu", warmup=0, steps_per_round=1)
    assert runner.m.tokens_per_step != tokens_of_one_step(CFG, "grad-accum")
