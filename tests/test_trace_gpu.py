"""On a GPU (the smoke stage): GPU busy time read off a real device timeline. The CPU tests hand the same code a
profiler with recorded device events (tests/test_trace.py); this one asks CUPTI itself, so that a torch whose profiler
records no device work under ``ProfilerActivity.CUDA`` alone shows here, at the first GPU call, and not as a column
of missing busy times in a recorded baseline. Skipped, with the reason, without CUDA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gptcore.config import Recipe
from gptcore.measure import trace
from gptcore.measure.runner import run_case
from gptcore.training.trainer import Trainer
from tests.helpers import TINY
from tests.test_trace import events_read

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the device's own timeline)"),
]


def test_a_real_step_on_the_gpu_has_a_busy_time_and_a_case_records_it():
    device = torch.device("cuda")
    trainer = Trainer(TINY, Recipe(), device)
    trainer.step()  # the first step's one-time work (cuBLAS handles, the optimizer's state) outside the trace
    timeline = trace.traced_step(trainer.step, trace.trace_for(device))
    linears = sum(isinstance(m, nn.Linear) for m in trainer.model.modules())
    assert timeline.events >= 3 * linears  # each Linear: a forward matmul and two in backward, at the least
    # the union of the intervals is at most their sum (equal where no two kernels overlapped); both sums of the same
    # microsecond figures, so 1 ns covers their floating-point rounding
    assert 0 < timeline.busy_seconds <= timeline.kernel_seconds + 1e-9
    # the split by kind adds up to the sum, and a GPT's step is matmuls first of all (the kinds read off CUPTI's names)
    assert sum(timeline.by_kind.values()) == pytest.approx(timeline.kernel_seconds, rel=1e-9)
    assert timeline.by_kind.get("matmul", 0) > 0, timeline.by_kind
    # one session after another in a process (a stage traces one per case): the same step, the same records, none
    # lost or mis-stamped at a session's head (its warm-up step takes those)
    assert [trace.traced_step(trainer.step, trace.trace_for(device)).events for _ in range(3)] == [timeline.events] * 3
    m = run_case(TINY, Recipe(), device, warmup=1, rounds=1, steps_per_round=1)
    assert m.error is None and m.gpu_busy_seconds is not None and m.gpu_busy_seconds > 0 and m.gpu_kernel_seconds


def test_a_compiled_cases_traced_step_runs_the_compiled_kernels(monkeypatch):
    """After the work ledger's eager step, the traced step of a compiled case runs inductor's Triton kernels, and its
    busy time is within its timed step's (before the fix, ladder-8's traced step was the eager one: 42.8 ms busy in
    a step of 35.1 ms on an H200). tests/test_trace.py proves the same order on CPU."""
    device = torch.device("cuda")
    read = events_read(monkeypatch)
    m = run_case(TINY, Recipe(compile=True), device, warmup=2, rounds=3, steps_per_round=2)
    assert m.error is None and len(read) == 1
    kernels = {e.name for e in read[0] if trace.is_work(e, trace.trace_for(device))}
    assert any(name.startswith("triton_") for name in kernels), sorted(kernels)
    assert m.gpu_busy_seconds <= min(m.round_seconds) / m.steps_per_round
