"""The CPU-shape study: nanoGPT's CPU model, one dimension doubled at a time, x nanoGPT's CPU command's recipes.

Runs in CI (-m cpu). 20 cases x (3 warm-up + 11 rounds x 4 steps + a 2-step tracked pass for the peak) take
about a minute on 2 cores at ~20-120 ms per step (the loss is read after step 47).
"""

from __future__ import annotations

import pytest

from bench.harness import Timing, grid, benchmark_case
from gptcore.presets import STUDIES

STUDY = STUDIES["cpu-shape"]
TIMING = Timing(warmup=3, rounds=11, steps_per_round=4)

pytestmark = pytest.mark.cpu


@pytest.mark.benchmark(group="cpu-shape study")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_cpu_shape(benchmark, gate, request, model: str, recipe: str) -> None:
    benchmark_case(benchmark, gate, request, STUDY, model, recipe, TIMING)
