"""The char-shape study on a GPU: nanoGPT's shakespeare_char model, one dimension doubled at a time, x six
recipes."""

from __future__ import annotations

import pytest

from bench.harness import benchmark_case, grid
from gptcore.presets import STUDIES

STUDY = STUDIES["char-shape"]
TIMING = STUDY.timing

pytestmark = pytest.mark.gpu


@pytest.mark.benchmark(group="char-shape study")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_char_shape(benchmark, gate, request, model: str, recipe: str) -> None:
    benchmark_case(benchmark, gate, request, STUDY, model, recipe, TIMING)
