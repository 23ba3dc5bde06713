"""Profile training steps of one (model, recipe) with torch.profiler and report where the time goes.

    python scripts/profile_step.py --model gpt2 --recipe ladder-8 [--batch N] [--steps 5] --out DIR

Writes DIR/profile-<model>-<recipe>.txt (top kernels by device time, and tokens/s) and a gzipped Chrome trace.
Warm-up (compile included) happens before the profiled window.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gptcore, installed or not

from gptcore.cli.arguments import positive  # noqa: E402
from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.presets import get_model, get_recipe  # noqa: E402
from gptcore.training.trainer import Trainer, resolve_device  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--recipe", default="ladder-8")
    parser.add_argument("--batch", type=positive, default=None)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.exit(2, f"profile_step: --warmup must be 0 or more, got {args.warmup}\n")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out}: not a folder")
    why = unwritable(Path(args.out) / "profile.json")  # before the steps: the trace must not be lost at the end
    if why:
        parser.exit(2, f"profile_step: --out {args.out}: {why}\n")
    try:
        cfg, recipe = get_model(args.model), get_recipe(args.recipe)
        if args.batch:
            cfg = dataclasses.replace(cfg, batch_size=args.batch)
        device = resolve_device(args.device)
        trainer = Trainer(cfg, recipe, device)
    except (ValueError, RuntimeError) as err:  # unknown names, a device torch does not know, a recipe it cannot run
        print(f"profile_step: {err}", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        trainer.step()
    sync()
    warmup_s = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            trainer.step()
        sync()
        seconds = time.perf_counter() - t0
    tok_s = args.steps * trainer.tokens_per_step / seconds
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"profile-{args.model}-{args.recipe}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    header = (
        f"{args.model} / {args.recipe} on {device} ({name}),"
        f" torch {torch.__version__}: batch {trainer.micro_batch}x{trainer.accum}, {tok_s:,.0f} tok/s under the"
        f" profiler (warm-up incl. compile {warmup_s:.1f} s)\n"
    )
    with open(stem + ".txt", "w") as f:
        f.write(header + table + "\n")
    prof.export_chrome_trace(stem + ".json")
    with open(stem + ".json", "rb") as raw, gzip.open(stem + ".json.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)  # traces run to tens of MB; gzip packs them ~10x
    os.remove(stem + ".json")
    print(header + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
