"""Does the CPU-shape study still learn? Each case trains nanoGPT's CPU command for its whole 2,000 steps (lr decay
to 2,000, checkpointing on) and is gated on its final validation loss and its time-to-loss
(gptcore.measure.convergence).

The full table is opt-in (-m convergence -k convergence_cpu_shape_full): 20 cases, one thread each, about 90
single-thread minutes in all; recorded in two processes split with -k (1 h 25 min of wall time on a shared 2-core
machine). CI runs one case on a 200-step schedule of its own (-m cpu, about 20 s). Its id,
``cpu-small+ckpt-fp32``, keeps it out of ``-k cpu-small-ckpt-fp32``, the one-case check of the benchmark case;
``-k convergence`` selects it.
"""

from __future__ import annotations

import pytest

from bench.harness import converge_case, grid
from gptcore.presets import CPU_SHAPE_SHORT, STUDIES

STUDY = STUDIES["cpu-shape"]

pytestmark = pytest.mark.convergence


@pytest.mark.benchmark(group="cpu-shape convergence (2,000 steps)")
@pytest.mark.parametrize(("model", "recipe"), grid(STUDY))
def test_convergence_cpu_shape_full(benchmark, gate, request, model: str, recipe: str) -> None:
    converge_case(benchmark, gate, request, STUDY, model, recipe)


@pytest.mark.cpu
@pytest.mark.benchmark(group="cpu-shape convergence (200 steps, CI)")
@pytest.mark.parametrize(("model", "recipe"), [pytest.param("cpu-small", "ckpt-fp32", id="cpu-small+ckpt-fp32")])
def test_convergence_cpu_shape_short(benchmark, gate, request, model: str, recipe: str) -> None:
    converge_case(benchmark, gate, request, STUDY, model, recipe, CPU_SHAPE_SHORT)
