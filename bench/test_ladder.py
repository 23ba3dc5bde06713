"""The ladder on a GPU: GPT-2 124M up the optimization ladder (fp32 -> tf32 -> no-sync -> amp -> compile -> flash ->
vocab-pad -> tied -> workers). Each rung is also checked not to be slower than the rung before it beyond noise.

Noise bound: rung k is "slower" when median_k < median_{k-1} - max(IQR_k + IQR_{k-1}, 2% of median_{k-1}), i.e.
the drop exceeds the two rounds' spreads together (and a 2% floor for very tight runs). Checked only when both
rungs ran in this session (a -k selection may leave one out).
"""

from __future__ import annotations

import pytest

from bench.harness import Counts, grid, measure
from gptcore.config import STUDIES
from gptcore.measure import Measurement

STUDY = STUDIES["ladder"]
COUNTS = Counts(warmup=5, rounds=7, steps_per_round=5)
FLOOR = 0.02

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="session")
def rungs() -> dict[int, Measurement]:
    """Measurements of the ladder rungs that ran in this session, by rung number."""
    return {}


def slower_than_previous(now: Measurement, before: Measurement) -> str | None:
    """Why ``now`` counts as slower than ``before`` beyond noise (see the module docstring), or None."""
    bound = max(now.tokens_per_s_iqr + before.tokens_per_s_iqr, FLOOR * before.tokens_per_s)
    if now.tokens_per_s < before.tokens_per_s - bound:
        return (f"{now.tokens_per_s:,.0f} tok/s is below the previous rung's {before.tokens_per_s:,.0f} by more "
                f"than the noise bound {bound:,.0f} (sum of IQRs, floor {FLOOR:.0%})")
    return None


@pytest.mark.benchmark(group="ladder")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_ladder(benchmark, gate, request, rungs: dict[int, Measurement], model: str, recipe: str) -> None:
    m = measure(benchmark, gate, request, STUDY, model, recipe, COUNTS)
    rung = int(recipe.rsplit("-", 1)[1])
    rungs[rung] = m
    before = rungs.get(rung - 1)
    if before is not None:
        reason = slower_than_previous(m, before)
        assert reason is None, f"{request.node.name}: {reason}"
