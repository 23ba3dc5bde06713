"""Seed 000 on a GPU: nanoGPT's shakespeare_char model and one dimension doubled at a time x six recipes."""

from __future__ import annotations

import pytest

from bench.harness import grid, measure
from gptcore.config import RECIPES

MODELS_000 = ("char", "char-ctx2", "char-layers2", "char-embd2")
RECIPES_000 = {name: RECIPES[name] for name in ("fp32", "sgd-cosine", "fp16", "bf16", "small-batch", "grad-accum")}
WARMUP, ROUNDS, STEPS = 5, 10, 10

pytestmark = pytest.mark.gpu


@pytest.mark.benchmark(group="seed000-matrix")
@pytest.mark.parametrize(("model", "recipe"), grid(MODELS_000, RECIPES_000, "cuda"))
def test_matrix(benchmark, gate, request, model: str, recipe: str) -> None:
    measure(benchmark, gate, request, model, recipe, RECIPES_000[recipe], "cuda",
            warmup=WARMUP, rounds=ROUNDS, steps_per_round=STEPS)
