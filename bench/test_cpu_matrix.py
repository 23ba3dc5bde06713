"""Seed 001 on CPU: nanoGPT's CPU model and one dimension doubled at a time x five recipes, checkpointing on.

Runs in CI (-m cpu). 20 cases x (3 warm-up + 11 rounds x 4 steps + a 2-step tracked pass for the peak) take
about a minute on 2 cores at ~20-120 ms per step (the loss is read after step 47).
"""

from __future__ import annotations

import dataclasses

import pytest

from bench.harness import grid, measure
from gptcore.config import RECIPES, Recipe

MODELS_001 = ("cpu-small", "cpu-heads2", "cpu-layers2", "cpu-embd2")
WARMUP, ROUNDS, STEPS = 3, 11, 4


def seed001(name: str) -> Recipe:
    """Seed 001's version of a named recipe."""
    recipe = dataclasses.replace(RECIPES[name], checkpoint=True)  # seed 001 ran every case with checkpointing on
    if name == "small-batch":
        # the shared small-batch quarters the batch (seed 000: 64 -> 16); seed 001 halved it: 12 -> 6
        recipe = dataclasses.replace(recipe, batch_divisor=2)
    elif name == "grad-accum":
        # the shared grad-accum uses 4 micro-batches; seed 001's is 2 micro-batches of 6 (same batch of 12)
        recipe = dataclasses.replace(recipe, grad_accum_steps=2)
    return recipe


RECIPES_001 = {name: seed001(name) for name in ("fp32", "small-batch", "grad-accum", "sgd-cosine", "bf16")}

pytestmark = pytest.mark.cpu


@pytest.mark.benchmark(group="seed001-cpu-matrix")
@pytest.mark.parametrize(("model", "recipe"), grid(MODELS_001, RECIPES_001, "cpu"))
def test_cpu_matrix(benchmark, gate, request, model: str, recipe: str) -> None:
    measure(benchmark, gate, request, model, recipe, RECIPES_001[recipe], "cpu",
            warmup=WARMUP, rounds=ROUNDS, steps_per_round=STEPS)
