"""Measure the dense matmul peak of this device (TFLOP/s), the honest denominator for MFU.

    python scripts/matmul_peak.py [--dtype bf16] [--size 8192] [--json OUT.json]

Times square matmuls with CUDA events (a synchronized clock on CPU) after warm-up, median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gptcore, installed or not

from gptcore.cli.arguments import positive  # noqa: E402
from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.measure.timing import StepTimer  # noqa: E402
from gptcore.training.trainer import resolve_device  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


def matmul_tflops(device: torch.device, dtype: str, size: int, rounds: int = 20) -> dict:
    """Median TFLOP/s of ``size``-cube matmuls in ``dtype`` on ``device``."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        a = torch.randn(size, size, device=device, dtype=DTYPES[dtype])
        b = torch.randn(size, size, device=device, dtype=DTYPES[dtype])
        for _ in range(3):
            a @ b
        times, timer = [], StepTimer(device)  # CUDA events on a GPU, the host clock on CPU
        for _ in range(rounds):
            with timer:
                a @ b
            times.append(timer.seconds)
    finally:
        torch.set_float32_matmul_precision(previous)
    median = statistics.median(times)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "dtype": dtype,
        "size": size,
        "median_s": median,
        "tflops": 2 * size**3 / median / 1e12,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--size", type=positive, default=8192)
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", default=None, help="write the result here too")
    args = parser.parse_args()
    why = unwritable(Path(args.json)) if args.json else None
    if why:  # before the matmuls: the result must not be lost at the end
        print(f"matmul_peak: --json {args.json}: {why}", file=sys.stderr)
        return 2
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as err:  # a device torch does not know, or CUDA without one
        print(f"matmul_peak: {err}", file=sys.stderr)
        return 2
    result = matmul_tflops(device, args.dtype, args.size)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
