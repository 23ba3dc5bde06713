"""GPU busy time of one step: how long the device itself worked, read from its own timeline.

One optimizer step runs under ``torch.profiler`` with the device's activity (CUDA: CUPTI's kernel, copy and memset
records). Each device event carries the device's start and end; the busy time is the **union** of those intervals,
not the sum of their durations: kernels on two streams that overlap (a copy under a matmul, NCCL beside compute)
count once, so the figure is the wall time of the device timeline that had work on it, never more than the step.
The sum is computed beside it (``DeviceTime.kernel_seconds``, not recorded); where the two differ, streams
overlapped. The sum is also split by kind of kernel, read off each kernel's name (:data:`KINDS`: matmul, attention,
inductor's generated kernels, ...): where a step's busy time moved, the gate names the kinds that moved it.

Neither figure sees the host: a kernel's device timestamps do not move when the Python that launched it ran slower
(a shared host, a busier CPU), only the gaps between kernels do, and the union leaves gaps out. The host's share of a
step is held by the work ledger's op counts (gptcore.measure.work); this is the device's share. Under DDP or FSDP2 a
collective's kernel is busy while it waits for the other ranks, so there the figure holds the waits too (a job's is
its busiest rank's, gptcore.measure.launch.combine).

The device is chosen here and only here (:func:`trace_for`): on CUDA the profiler traces ``ProfilerActivity.CUDA``;
on CPU there is no device timeline, so there is no trace and no figure. The step, the profiler and the arithmetic
are the same code on every device: only the activity differs (tests hand the same path a CPU activity, or a
profiler whose events carry device times).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""The device activities that are work (kineto's names; the set torch.profiler's own CUPTI tools take as device
work). A ``gpu_user_annotation`` is a range drawn over the kernels of a ``record_function``, gaps included: never
work."""

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # cuDNN's and FlashAttention's attention kernels name cutlass, gemm or wgmma too: attention is read first
    ("attention", re.compile(r"sdpa|flash|fmha|attention|attn|cudnn", re.IGNORECASE)),
    # cuBLAS(Lt) and cutlass kernels (nvjet: cuBLAS's on Hopper, FP8's scaled matmuls among them); triton_tem_:
    # inductor's autotuned matmul templates
    ("matmul", re.compile(r"gemm|gemv|nvjet|cutlass|cublas|xmma|triton_tem_", re.IGNORECASE)),
    ("inductor", re.compile(r"^triton_")),  # inductor's generated kernels: fused pointwise ops, norms, the loss
    ("foreach", re.compile(r"multi_tensor_apply")),  # foreach and fused optimizers, gradient clipping's norm
    ("collective", re.compile(r"nccl", re.IGNORECASE)),
    ("memcpy/memset", re.compile(r"^Mem(cpy|set)\b")),  # the device's copies and memsets (CUPTI's names)
)
"""The kinds of device work by name, the first that matches; a kernel matching none is ``other`` (eager elementwise
kernels and reductions, other packages' Triton kernels). Read off CUPTI's kernel names, which a CUDA or torch release
may change: the split says where a busy time moved; the busy time itself is what is gated."""
OTHER = "other"


def kind_of(name: str) -> str:
    """The kind of a device event by its name (:data:`KINDS`), else ``other``."""
    return next((kind for kind, pattern in KINDS if pattern.search(name)), OTHER)


profile = torch.profiler.profile
"""The profiler a step is traced with (a test hands in one whose events carry recorded device times)."""


@dataclass(frozen=True)
class DeviceTrace:
    """How one device type's timeline is traced: the profiler's activity, the device type its events carry, how to
    wait for the device's work to end (inside the trace, so that every kernel of the step is in it), and which of its
    activities are work."""

    activity: ProfilerActivity
    device_type: DeviceType
    synchronize: Callable[[], None]
    work: frozenset[str] = WORK


@dataclass(frozen=True)
class DeviceTime:
    """One step's device timeline."""

    busy_seconds: float
    """The union of the device events' intervals: the time the device had work."""
    kernel_seconds: float
    """The sum of the device events' durations (above ``busy_seconds`` where streams overlapped)."""
    events: int
    by_kind: dict[str, float] = field(default_factory=dict)
    """``kernel_seconds`` split by kind of event (:func:`kind_of`), in :data:`KINDS`' order, ``other`` last."""


def trace_for(device: torch.device) -> DeviceTrace | None:
    """The device's trace: CUDA's activity on a CUDA device; None on CPU (no device timeline, no busy time)."""
    if device.type == "cuda":
        return DeviceTrace(ProfilerActivity.CUDA, DeviceType.CUDA, lambda: torch.cuda.synchronize(device))
    return None


def is_work(event: Any, trace: DeviceTrace) -> bool:
    """A profiler event (``FunctionEvent``) that is work on the traced device: on its timeline, and of one of the
    trace's working activities where the event names its activity (a torch release whose events do not: any event on
    the device that is not a user annotation)."""
    if event.device_type != trace.device_type:
        return False
    activity = getattr(event, "activity_type", None)
    if activity:
        return activity in trace.work
    return not getattr(event, "is_user_annotation", False)


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals: overlapping ones count once."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def device_time(events: Iterable[Any], trace: DeviceTrace) -> DeviceTime:
    """The busy time and the kernels' summed time of the device's work among ``events`` (``FunctionEvent``s, their
    ``time_range`` in microseconds on the device's clock)."""
    work = [e for e in events if is_work(e, trace)]
    spans = [(e.time_range.start, e.time_range.end) for e in work]
    by_kind = dict.fromkeys([kind for kind, _ in KINDS] + [OTHER], 0.0)
    for e, (start, end) in zip(work, spans):
        by_kind[kind_of(e.name)] += (end - start) / 1e6
    return DeviceTime(
        busy_seconds=union_us(spans) / 1e6,
        kernel_seconds=sum(end - start for start, end in spans) / 1e6,
        events=len(spans),
        by_kind={kind: seconds for kind, seconds in by_kind.items() if seconds},
    )


WARMUP_STEPS = 1
"""Steps traced and thrown away before the one that is read: the profiler's own warm-up (``torch.profiler.schedule``),
whose documentation says why: the first records of a trace are skewed by the profiler's start. On CUDA a session's
first kernel records can also be lost or mis-stamped (CUPTI re-registers its clock callback at every session, and
pytorch/pytorch#192021 found one more record lost per session in a process): those fall in the warm-up."""


def traced_step(step: Callable[[], object], trace: DeviceTrace) -> DeviceTime:
    """Run ``step`` under the profiler with ``trace``'s activity, a warm-up step (:data:`WARMUP_STEPS`) and then the
    step that is read, each waited for on the device, and read that last step's timeline."""
    schedule = torch.profiler.schedule(wait=0, warmup=WARMUP_STEPS, active=1, repeat=1)
    with profile(activities=[trace.activity], schedule=schedule) as prof:
        for _ in range(WARMUP_STEPS + 1):
            step()
            trace.synchronize()
            prof.step()
    return device_time(prof.events(), trace)


_started: set[str] = set()


def start_once(device: torch.device) -> None:
    """Start and stop the device's profiler once in the process, before the first case builds its model: a CUDA
    graph captured before the profiler's first use and replayed under it (a busy-time trace of max-autotune's
    graphs) broke CUPTI (pytorch/pytorch#75504; torch.profiler._utils._init_for_cuda_graphs does this same empty
    session). Nothing on a device with no trace."""
    device_trace = trace_for(device)
    if device_trace is None or device.type in _started:
        return
    with profile(activities=[device_trace.activity]):
        pass
    _started.add(device.type)


STEP_SLACK = 0.10
"""How far a step's busy time may exceed its slowest timed step before the figure is refused. The union of one
step's device intervals is never longer than that step; the traced step and the timed ones differ only by the clocks
they ran at (the H200 held compiled steps at 1830-1965 MHz under its power cap at B=16, a 7% spread) and timing
noise."""


def beyond_step(busy: float | None, step_seconds: float | None) -> str | None:
    """Why ``busy`` cannot be the busy time of the step that was timed (``step_seconds``, the slowest timed step):
    more than :data:`STEP_SLACK` above it, the traced step did other work than the timed one (on an H200 the traced
    steps of compiled cases once ran eagerly: ladder-8's 42.77 ms of kernels against a step of 35.1 ms); None where
    it can be, or where either figure is missing."""
    if busy is None or not step_seconds or busy <= step_seconds * (1 + STEP_SLACK):
        return None
    return (
        f"GPU busy time {busy * 1e3:,.2f} ms is {busy / step_seconds - 1:.0%} above the slowest timed step"
        f" ({step_seconds * 1e3:,.2f} ms): the traced step did other work than the timed one"
    )


def step_timeline(step: Callable[[], object], device: torch.device) -> DeviceTime | None:
    """The device timeline of one call of ``step`` on ``device`` (after a traced warm-up call): its busy time and its
    kernel time by kind. None, and ``step`` not called, on a device with no trace (CPU); None where the profiler saw
    no work on the device (a torch built without CUPTI), never a busy time of 0 that would read as every kernel
    gone."""
    device_trace = trace_for(device)
    if device_trace is None:
        return None
    timeline = traced_step(step, device_trace)
    return timeline if timeline.events else None
