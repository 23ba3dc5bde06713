"""Timing and throughput: a step timer (CUDA events or the host clock, with the process's CPU share), the CPU
calibration kernel, tokens/s over rounds, the datasheet peak FLOPs and MFU, and a process's peak memory."""

from __future__ import annotations

import contextlib
import math
import re
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence

import torch


def process_peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak memory so far and what it is: the CUDA allocator's peak on a GPU; on CPU the process's peak resident
    memory (everything the process holds, not only tensors: the benchmarks' tracked tensor bytes are another
    figure)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "CUDA allocated"
    # getrusage's ru_maxrss: KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "process RSS"


# -- peak FLOPs and MFU ------------------------------------------------------------------------------------------

#: Dense peak TFLOP/s from the vendors' datasheets (sparsity figures halved), per precision class: "fp32" on the
#: CUDA cores (TF32 off), "tf32" and "16-bit" (fp16/bf16 with fp32 accumulation) on the tensor cores.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "16-bit": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "16-bit": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "16-bit": 835.5},
    "H200 SXM": {"fp32": 67.0, "tf32": 494.7, "16-bit": 989.4},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "16-bit": 835.5},
    "A100": {"fp32": 19.5, "tf32": 156.0, "16-bit": 312.0},  # 40/80 GB, SXM4 and PCIe alike
    "L4": {"fp32": 30.3, "tf32": 60.0, "16-bit": 121.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "16-bit": 362.1},
    "L40": {"fp32": 90.5, "tf32": 90.5, "16-bit": 181.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "16-bit": 165.2},  # GeForce: half rate with fp32 accumulation
    "A10": {"fp32": 31.2, "tf32": 62.5, "16-bit": 125.0},
    "A10G": {"fp32": 35.0, "tf32": 70.0, "16-bit": 140.0},  # A10's GA102 with 80 SMs at 1.71 GHz
}

# (pattern on the lowercased torch.cuda.get_device_name, key of PEAK_TFLOPS); first match wins
_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bh100\b.*\bnvl\b", "H100 NVL"),
    (r"\bh100\b.*\bpcie\b", "H100 PCIe"),
    (r"\bh100\b.*(\bsxm|\bhbm3)", "H100 SXM"),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"\bh200\b.*\bnvl\b", "H200 NVL"),
    (r"\bh200\b", "H200 SXM"),
    (r"\ba100\b", "A100"),
    (r"\bl40s\b", "L40S"),
    (r"\bl40\b", "L40"),
    (r"\bl4\b", "L4"),
    (r"\brtx 4090\b", "RTX 4090"),
    (r"\ba10g\b", "A10G"),
    (r"\ba10\b", "A10"),
)

_PRECISION_CLASS = {"fp32": "fp32", "tf32": "tf32", "fp16": "16-bit", "bf16": "16-bit", "bf16-pure": "16-bit"}


def gpu_key(device_name: str) -> str | None:
    """The PEAK_TFLOPS key for a CUDA device name, or None for a GPU not in the table."""
    name = device_name.lower()
    for pattern, key in _GPU_PATTERNS:
        if re.search(pattern, name):
            return key
    return None


def peak_flops(device_name: str, precision: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` for a recipe precision; None when the GPU is unknown (no guessing)."""
    key = gpu_key(device_name)
    if key is None:
        return None
    return PEAK_TFLOPS[key][_PRECISION_CLASS[precision]] * 1e12


def mfu(flops_per_token: float, tokens_per_s: float, device_name: str | None, precision: str) -> float | None:
    """Model FLOPs utilization in [0, 1]: achieved training FLOP/s over the GPU's peak; None on CPU or an unknown
    GPU (``device_name`` None means CPU)."""
    peak = peak_flops(device_name, precision) if device_name else None
    return None if peak is None else flops_per_token * tokens_per_s / peak


# -- timing --------------------------------------------------------------------------------------------------------


class StepTimer:
    """Seconds of the work done inside ``with timer:``; on CUDA recorded with events and synchronized at the end
    (the one sync of a round), on CPU the host clock. ``timer.seconds`` holds the last interval; on CPU
    ``timer.cpu_share`` is the process's CPU time over (wall time x torch threads): about 1 when the process had
    its cores to itself (idle OpenMP threads spin), about 0.5 or less when another process competed for them."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.seconds = 0.0
        self.cpu_share: float | None = None
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def __enter__(self) -> StepTimer:
        if self.device.type == "cuda":
            self._start.record()
        else:
            self._c0, self._t0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self._end.record()
            self._end.synchronize()
            self.seconds = self._start.elapsed_time(self._end) / 1000.0
        else:
            self.seconds = time.perf_counter() - self._t0
            cpu = time.process_time() - self._c0
            self.cpu_share = cpu / (self.seconds * torch.get_num_threads()) if self.seconds > 0 else None


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` intra-op threads (None: leave them), restored after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


CALIBRATION_SIZE = 384
CALIBRATION_SPREAD = 0.10
"""A CPU tokens/s is recorded only if the calibration kernel, timed before every round, stays within this of its
median."""
_CALIBRATION: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def calibration_kernel() -> float:
    """Seconds of a fixed piece of CPU work: 16 fp32 matmuls of 384 x 384 (1.8 GFLOP, ~9 ms on 2 cores), on the
    process's torch threads, the faster of two timings. Timed between rounds, it says whether the machine stayed the
    same, and a step's time over it is a speed figure that other load moves less than raw tokens/s (the "calibrated
    step cost"). The product goes into one preallocated tensor, so the allocator's state after a round does not
    enter the time, and the faster of two timings drops a one-off stall, while load that lasts slows both. Beside
    the rounds of cpu-small x ckpt-fp32 on an idle 2-core EPYC, 20 cases of 3 rounds each: the kernel strayed more
    than 10% off its median in 8 cases with a fresh output per matmul, 6 with a preallocated one, 4 with the
    faster of three."""
    global _CALIBRATION
    if _CALIBRATION is None:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(CALIBRATION_SIZE, CALIBRATION_SIZE, generator=g) for _ in range(2))
        _CALIBRATION = a, b, torch.empty(CALIBRATION_SIZE, CALIBRATION_SIZE)
    a, b, out = _CALIBRATION
    best = math.inf
    for _ in range(2):
        t0 = time.perf_counter()
        for _ in range(16):
            torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return best


def throughput(round_seconds: Sequence[float], tokens_per_round: int) -> tuple[float, float]:
    """(median, IQR) of tokens/s over rounds; quartiles by linear interpolation (numpy's default). One round has
    an IQR of 0."""
    if not round_seconds:
        raise ValueError("round_seconds: need at least one timed round")
    rates = sorted(tokens_per_round / s for s in round_seconds)
    if len(rates) == 1:
        return rates[0], 0.0
    q1, median, q3 = statistics.quantiles(rates, n=4, method="inclusive")
    return median, q3 - q1
