"""Does the char-shape study still learn? nanoGPT's shakespeare_char model and its shape variants, each recipe
trained for nanoGPT's 5,000 iterations on a GPU (about 1-2 minutes a case on an H100) and gated on its final
validation loss and time-to-loss (gptcore.measure.convergence). Opt-in: -m convergence; skipped without CUDA."""

from __future__ import annotations

import pytest

from bench.harness import converge_case, grid, run_if
from gptcore.presets import STUDIES

STUDY = STUDIES["char-shape"]

pytestmark = [pytest.mark.convergence, *run_if(cuda=True)]


@pytest.mark.benchmark(group="char-shape convergence (5,000 steps)")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_convergence_char_shape(benchmark, gate, request, model: str, recipe: str) -> None:
    converge_case(benchmark, gate, request, STUDY, model, recipe)
