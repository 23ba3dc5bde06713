"""What does each memory recipe cost in quality? The memory-recipe study's 1.6B shape and eleven recipes on the
Shakespeare characters (the study's own model reads random tokens, which have nothing to learn), 300 steps each,
gated on the final validation loss (gptcore.measure.convergence). Opt-in: -m convergence; skipped without CUDA."""

from __future__ import annotations

import pytest

from bench.harness import converge_case, grid, run_if
from gptcore.presets import QUALITY_STUDIES

STUDY = QUALITY_STUDIES["memory-recipe-quality"]

pytestmark = [pytest.mark.convergence, pytest.mark.slow, *run_if(cuda=True)]


@pytest.mark.benchmark(group="memory-recipe quality (300 steps)")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_convergence_memory_recipes(benchmark, gate, request, model: str, recipe: str) -> None:
    converge_case(benchmark, gate, request, STUDY, model, recipe)
