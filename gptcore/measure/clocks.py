"""Why a timed round is flagged: on a GPU its clocks and throttling, read through NVML (nvidia-ml-py, the optional
``gpu`` extra) as nvbench does, since a round run below the GPU's clocks says nothing about the code; on CPU the share
of the cores the process got (:data:`BUSY_SHARE`).

A round is flagged when a thermal or hardware slowdown reason was set while it ran, or when its SM clock was below
:data:`SLOW_CLOCK` of the default application clock with nothing of the work's own holding it there. The software
power cap is the work's own: it is the steady state of a GPU busy at its power limit, and the clock it leaves follows
the work's power draw. An H200 at 700 W held GPT-2's compiled steps at 1830-1965 MHz of its 1980 at a batch of 16,
the power-cap bit set in every round, and at a median of 1515-1620 MHz (77-82%) at 691-695 W at the batch that
fills the device, 146, over four runs, one round of seven below 75% in two of them (its reasons were not logged then;
the results log keeps every round's now). So a round at the power cap is never flagged for its clock (it would leave
a heavier step's speed unrecorded as "machine unfit", and the median biased to the faster rounds): the clock is
recorded, and a run whose clock is below its baseline's is not compared for speed (gptcore.gate.checks.clocks_moved).
gptcore.measure.runner samples each round while its work is still running (after the steps are queued, before the
round's one sync), leaves flagged rounds out of the tokens/s median, and calls the case "machine unfit" when more
than half were flagged. Without NVML (no GPU, no package, no permission) nothing is sampled and nothing changes.
Tests hand in a fake NVML module.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BUSY_SHARE", "Clocks", "POWER_CAP", "Sample", "SLOW_CLOCK", "open_clocks", "summary"]

BUSY_SHARE = 0.9
"""Below this share of the CPU the process got while timed, a CPU tokens/s figure says little: flagged as busy, and
never recorded into a baseline."""

SLOW_CLOCK = 0.75
"""A round whose SM clock is below this share of the default application clock is flagged."""
#: NVML's clock-event (throttle) reason bits that mean the GPU slowed itself down (nvml.h,
#: nvmlClocksEventReason*): idle, application-clock and sync-boost reasons are not slowdowns of a busy GPU, and the
#: software power cap (0x04) is a busy GPU's normal state, judged by its SM clock alone.
THROTTLE_REASONS = {
    0x08: "hardware slowdown",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake (hardware)",
}
POWER_CAP = 0x04
"""NVML's software power-cap reason (nvmlClocksEventReasonSwPowerCap): the clock is held by the work's own power
draw at the GPU's power limit, so a low clock with it set flags nothing."""
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0


@dataclass(frozen=True)
class Sample:
    """One NVML reading."""

    sm_mhz: int
    mem_mhz: int
    temperature_c: int
    power_w: float
    reasons: int
    """The clock-event (throttle) reasons bitmask."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Clocks:
    """NVML readings of one GPU: ``sample()`` now, ``flag(sample)`` why a round at it is not to be trusted."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.default_sm_mhz = int(nvml.nvmlDeviceGetDefaultApplicationsClock(handle, NVML_CLOCK_SM))
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # older nvidia-ml-py

    def sample(self) -> Sample:
        n, h = self.nvml, self.handle
        return Sample(
            sm_mhz=int(n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)),
            mem_mhz=int(n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_MEM)),
            temperature_c=int(n.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)),
            power_w=n.nvmlDeviceGetPowerUsage(h) / 1000.0,
            reasons=int(self._reasons(h)),
        )

    def flag(self, s: Sample) -> str | None:
        """Why a round sampled at ``s`` ran below the GPU's clocks, or None: a slowdown reason, or a clock below
        :data:`SLOW_CLOCK` of the default that no power cap (:data:`POWER_CAP`) holds."""
        why = [name for bit, name in THROTTLE_REASONS.items() if s.reasons & bit]
        if s.sm_mhz < SLOW_CLOCK * self.default_sm_mhz and not s.reasons & POWER_CAP:
            why.insert(0, f"SM clock {s.sm_mhz} MHz < {SLOW_CLOCK:.0%} of {self.default_sm_mhz}")
        return "; ".join(why) or None


def load_nvml() -> Any:
    """The pynvml module of nvidia-ml-py, or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def open_clocks(device: Any, nvml: Any = None) -> Clocks | None:
    """NVML readings of a CUDA ``device`` (a torch.device), or None on CPU or without a usable NVML."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    nvml = nvml or load_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        try:  # by UUID: right under CUDA_VISIBLE_DEVICES, whose indices are not NVML's
            handle = nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}") if uuid else None
        except Exception:  # an NVML error of its own type: fall back to the index
            handle = None
        handle = handle or nvml.nvmlDeviceGetHandleByIndex(index)
        return Clocks(nvml, handle)
    except Exception:  # NVML's own error types (no driver, no permission): no clocks, no change
        return None


def summary(samples: list[Sample], flagged: list[int], default_sm_mhz: int) -> dict[str, Any]:
    """The clocks of the rounds that count (the unflagged ones; all when every round was flagged), for the
    baseline entry."""
    kept = [s for i, s in enumerate(samples) if i not in flagged] or samples
    return {
        "sm_mhz": statistics.median(s.sm_mhz for s in kept),
        "mem_mhz": statistics.median(s.mem_mhz for s in kept),
        "default_sm_mhz": default_sm_mhz,
        "temperature_c_max": max(s.temperature_c for s in samples),
        "power_w_median": round(statistics.median(s.power_w for s in kept), 1),
        "flagged_rounds": len(flagged),
        "rounds": len(samples),
    }
