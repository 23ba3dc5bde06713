"""The ladder on a GPU: GPT-2 124M up the optimization ladder (fp32 -> tf32 -> no-sync -> amp -> compile -> flash ->
vocab-pad -> tied -> workers). Each rung is also checked not to be slower than the rung before it beyond noise,
as an expected effect (gptcore.gate.expectations): rung k fails when median_k < median_{k-1} - max(IQR_k + IQR_{k-1},
2% of median_{k-1}), i.e. the drop exceeds the two rounds' spreads together (and a 2% floor for very tight runs).
Checked only when both rungs ran in this session; the end of the run names the rungs whose reference did not run.
"""

from __future__ import annotations

import pytest

from bench.harness import benchmark_case, grid
from gptcore.presets import STUDIES

STUDY = STUDIES["ladder"]
TIMING = STUDY.timing

pytestmark = pytest.mark.gpu


@pytest.mark.benchmark(group="ladder")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_ladder(benchmark, gate, request, model: str, recipe: str) -> None:
    benchmark_case(benchmark, gate, request, STUDY, model, recipe, TIMING)
