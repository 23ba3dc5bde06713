"""The CPU-shape study: nanoGPT's CPU model, one dimension doubled at a time, x nanoGPT's CPU command's recipes.

Runs in CI (-m cpu). Each case runs 2 warm-up steps (tracked: the peak) and 3 timed rounds of 2 steps, reads the
loss after step 8, then one step under the work ledger: what the exact checks need. Speed gates
nothing on CPU; ``--cpu-speed`` times 11 rounds for a median worth reading (the loss is still read after step 8).
"""

from __future__ import annotations

import pytest

from bench.harness import benchmark_case, grid
from gptcore.presets import STUDIES

STUDY = STUDIES["cpu-shape"]
TIMING = STUDY.timing

pytestmark = pytest.mark.cpu


@pytest.mark.benchmark(group="cpu-shape study")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_cpu_shape(benchmark, gate, request, model: str, recipe: str) -> None:
    benchmark_case(benchmark, gate, request, STUDY, model, recipe, TIMING)
