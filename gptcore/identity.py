"""The one place a device and a revision are identified: the CUDA device or the CPU a run measures on, their
names and the slug of their baseline file, the CPU model the loss references are kept per, the NVIDIA driver, and the
git commit a baseline was recorded from. torch is imported inside the functions that need it."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

CPU_MODEL_OVERRIDE = "GPTCORE_CPU_MODEL"
"""The environment variable that overrides :func:`cpu_model` (a test-only identity)."""


def slugify(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (lowercase, runs of non-alphanumerics -> '-')."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The host CPU's identity for loss references: its model string, and on x86 Linux its family and model
    numbers, e.g. 'AMD EPYC (family 25, model 17)'; on Arm Linux its implementer and part numbers, e.g. 'aarch64
    (implementer 0x41, part 0xd40)'; on macOS the chip's name, 'Apple M2 Pro'. The string alone is not enough:
    'AMD EPYC' names Zen 3 (no AVX-512, bf16 emulated) and Zen 4 (AVX-512 BF16) alike, and their bf16 arithmetic
    differs; an Arm kernel gives no name.
    ``cpuinfo``: the text of /proc/cpuinfo (default: read it, unless ``$GPTCORE_CPU_MODEL`` names the model).

    ``$GPTCORE_CPU_MODEL`` is for testing: it makes this machine pass for another CPU model, so that a run proves it
    depends on nothing the recording machine alone has (docs/gate.md)."""
    if cpuinfo is None and os.environ.get(CPU_MODEL_OVERRIDE):
        return os.environ[CPU_MODEL_OVERRIDE]
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip().lower(), value.strip())
    name = fields.get("model name")
    if "cpu implementer" in fields and "cpu part" in fields:
        # Arm: no model name, or a generic one ('ARMv8 Processor rev 1'); the implementer and part numbers name the
        # core (0x41 0xd0c: Neoverse N1, no bf16; 0x41 0xd40: Neoverse V1, with bf16), as family and model do on x86
        core = f"implementer {fields['cpu implementer']}, part {fields['cpu part']}"
        return f"{name or platform.machine() or 'Arm'} ({core})"
    if name is None:
        return mac_cpu_brand() or platform.processor() or platform.machine() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def mac_cpu_brand() -> str | None:
    """macOS's name of its CPU ('Apple M2 Pro'; an Apple M1 has no bf16 instructions, an M2 has), where
    platform.processor() says only 'arm'; None elsewhere."""
    if sys.platform != "darwin":
        return None
    try:
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def device_slug(device: Any) -> str:
    """File stem of a device's baselines: the slugified CUDA device name, or 'cpu'."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return slugify(torch.cuda.get_device_name(device))
    return "cpu"


def device_name(device: Any) -> str:
    """The name a baseline file gives its device: the CUDA device's name, or 'CPU'. A CPU file gathers entries
    recorded on several CPU models; each entry names its own, and the file counts them (``device.models``)."""
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def recording(device_type: str) -> dict[str, str | None]:
    """What a baseline file records of the device and stack an entry was measured on: ``gate.baselines.update``'s
    device_name, device_type, torch_version, cuda and driver."""
    import torch

    return {
        "device_name": device_name(device_type),
        "device_type": device_type,
        "torch_version": torch_version(),
        "cuda": torch.version.cuda,
        "driver": driver_version() if device_type == "cuda" else None,
    }


def torch_version() -> str:
    """The torch this process runs, '2.13.0+cpu' (what a measured entry and a baseline file record)."""
    import torch

    return torch.__version__


COMMIT_ENV = "GPTCORE_COMMIT"
"""Names the commit where git cannot: a tree copied without its history, or with a stale one (a container image; a
GPU machine sent the working tree)."""


def git_commit(cwd: str | Path | None = None) -> str | None:
    """HEAD's sha, with '+dirty' when the working tree has changes; None outside git. ``$GPTCORE_COMMIT``, where set,
    is the answer instead."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def session_slug() -> str:
    """The device this session benchmarks on: CUDA device 0 when present, else the CPU."""
    return device_slug(local_device())


def local_device() -> str:
    """'cuda' when torch sees a GPU, else 'cpu'."""
    return "cuda" if cuda_available() else "cpu"


def driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi (None without one)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None
