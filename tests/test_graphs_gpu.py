"""On a GPU: a compile mode that captures CUDA graphs (``reduce-overhead``; ``max-autotune`` adds autotuning) trains
as eager does. The ladder does not use them (docs/gpu.md: at the fitted batch a step's kernels outlast its launches
many times over), but a recipe may, for a small batch whose step waits on the host (``--set
compile_mode=reduce-overhead``). What only a GPU can show: inductor captures the graphs and skips none, a replay does
not overwrite an output the step still needs (the step begins a new graph iteration before each micro-batch, which
tests/test_ladder_rungs.py proves on CPU), and the losses equal eager's within bf16's rounding. Not a smoke check:
the smoke stops at its first failure, and no stage's case uses CUDA graphs. Skipped without CUDA.

The tolerance is the autotuned compile's (tests/test_kernels_gpu.py derives it): both steps run bf16 autocast, only
the kernels and their launches differ, so four steps' losses agree to 1e-2 relative.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptcore.config import Recipe
from gptcore.training.trainer import Trainer
from tests.helpers import TINY

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CUDA graphs are CUDA's)"),
]

SHAPE = dataclasses.replace(TINY, n_embd=128, n_head=4, batch_size=4)
# two micro-batches a step: a replay between a forward and the loss it returned would show here
EAGER = Recipe(precision="bf16", vocab_multiple=64, adamw_impl="fused", grad_accum_steps=2)
GRAPHS = dataclasses.replace(EAGER, compile=True, compile_mode="reduce-overhead")


def test_cuda_graphs_are_replayed_and_train_like_eager():
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    counters.clear()
    losses = {}
    for name, recipe in (("eager", EAGER), ("graphs", GRAPHS)):
        trainer = Trainer(SHAPE, recipe, "cuda")  # seeded by its recipe: the same weights and batches
        steps = [trainer.step() for _ in range(4)]  # device tensors, read only after the last step
        losses[name] = [loss.item() for loss in steps]
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert manager is not None and manager.roots, "no CUDA graph was recorded"
    assert losses["graphs"] == pytest.approx(losses["eager"], rel=1e-2)
