"""The memory-recipe study on a GPU: a 1.6B model under eleven memory recipes (peak allocated is the headline)."""

from __future__ import annotations

import pytest

from bench.harness import benchmark_case, grid
from gptcore.presets import STUDIES

STUDY = STUDIES["memory-recipe"]
# compile (the budget recipes) happens in the warm-up, outside the timing
TIMING = STUDY.timing

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.benchmark(group="memory-recipe study")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_memory_recipes(benchmark, gate, request, model: str, recipe: str) -> None:
    benchmark_case(benchmark, gate, request, STUDY, model, recipe, TIMING)
