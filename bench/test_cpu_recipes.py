"""The CPU-recipe study: nanoGPT's CPU model under every memory recipe (optimizer in backward, pure bf16, their
combinations with checkpointing, compile and the compiler's memory budget), regional compilation and the ladder's
bottom rung. Gated on memory, loss and the work ledger (FLOPs, operator calls, syncs, allocations, and the
compiled cases' graphs, graph breaks and recompilations). Runs in CI (-m cpu)."""

from __future__ import annotations

import pytest

from bench.harness import benchmark_case, grid
from gptcore.presets import STUDIES

STUDY = STUDIES["cpu-recipe"]
# compile happens in the warm-up, outside the timing
TIMING = STUDY.timing

pytestmark = pytest.mark.cpu


@pytest.mark.benchmark(group="cpu-recipe study")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_cpu_recipes(benchmark, gate, request, model: str, recipe: str) -> None:
    benchmark_case(benchmark, gate, request, STUDY, model, recipe, TIMING)
