"""Measurement: peak memory, tokens/s and MFU."""

from __future__ import annotations

import resource

import torch


def process_peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak memory so far and what it is: CUDA allocator peak on a GPU, the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "RSS"
