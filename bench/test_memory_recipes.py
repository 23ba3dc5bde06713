"""Seed 002 on a GPU: the 1.6B "Deep One" under the eleven memory recipes (peak allocated is the headline)."""

from __future__ import annotations

import pytest

from bench.harness import grid, measure
from gptcore.config import MEMORY_RECIPES, RECIPES

RECIPES_002 = {name: RECIPES[name] for name in MEMORY_RECIPES}
WARMUP, ROUNDS, STEPS = 3, 5, 3  # compile (budget recipes) happens in the warm-up, outside the timing

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.benchmark(group="seed002-memory-recipes")
@pytest.mark.parametrize(("model", "recipe"), grid(("deep-1.6b",), RECIPES_002, "cuda"))
def test_memory_recipes(benchmark, gate, request, model: str, recipe: str) -> None:
    measure(benchmark, gate, request, model, recipe, RECIPES_002[recipe], "cuda",
            warmup=WARMUP, rounds=ROUNDS, steps_per_round=STEPS)
