"""Record the CUDA allocator's history over a few training steps of one (model, recipe), out of memory included, and
say where the peak is: which lines of code allocated what was live at it (gptcore.memory.snapshot).

    python scripts/memory_snapshot.py --model deep-1.6b --recipe budget-0.05 [--steps 3] --out DIR

Prints the summary and writes it to DIR/snapshot-<model>-<recipe>.json, beside the gzipped snapshot (.pickle.gz;
gunzip it and drop it on https://pytorch.org/memory_viz). Needs CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import pickle
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gptcore, installed or not

from gptcore.cli.arguments import positive  # noqa: E402
from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.memory.snapshot import peak_of_trace  # noqa: E402
from gptcore.presets import get_model, get_recipe  # noqa: E402
from gptcore.units import format_bytes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deep-1.6b")
    parser.add_argument("--recipe", default="budget-0.05")
    parser.add_argument(
        "--steps", type=positive, default=3, help="optimizer steps (the optimizer state exists from 1 on)"
    )
    parser.add_argument("--max-entries", type=int, default=200_000, help="allocator events kept")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    try:
        cfg, recipe = get_model(args.model), get_recipe(args.recipe)
    except ValueError as err:
        print(f"memory_snapshot: {err}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("memory_snapshot: needs CUDA (the allocator history is CUDA's)", file=sys.stderr)
        return 2
    why = unwritable(Path(args.out) / f"snapshot-{args.model}-{args.recipe}.json")
    if why:  # before the steps: the snapshot must not be lost at the end
        print(f"memory_snapshot: --out {args.out}: {why}", file=sys.stderr)
        return 2
    from gptcore.training.trainer import Trainer

    os.makedirs(args.out, exist_ok=True)
    name = f"snapshot-{args.model}-{args.recipe}"
    torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks="python")
    error, steps_done = None, 0
    try:
        trainer = Trainer(cfg, recipe, "cuda")
        for _ in range(args.steps):
            trainer.step()
            steps_done += 1
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as err:
        error = str(err).strip().splitlines()[0]
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = peak_of_trace(snapshot["device_traces"][torch.cuda.current_device()])
    lines = [
        f"{args.model} × {args.recipe} on {torch.cuda.get_device_name()} (torch {torch.__version__}): "
        f"{steps_done} of {args.steps} steps" + (f", then out of memory: {error}" if error else ""),
        f"max_memory_allocated {format_bytes(torch.cuda.max_memory_allocated())}; peak of the trace "
        f"{format_bytes(peak.peak_bytes)} at event {peak.at_event:,} of {peak.events:,}"
        + (f"; first OOM event: {peak.oom}" if peak.oom else ""),
        "live at the peak, by the line that allocated it:",
    ]
    lines += [f"  {format_bytes(s.bytes):>12}  {s.blocks:6,} blocks  {s.where}" for s in peak.sites]
    summary = "\n".join(lines)
    print(summary)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(
            {
                "model": args.model,
                "recipe": args.recipe,
                "steps_done": steps_done,
                "error": error,
                "max_memory_allocated": torch.cuda.max_memory_allocated(),
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name(),
                **dataclasses.asdict(peak),
            },
            f,
            indent=1,
        )
    with gzip.open(os.path.join(args.out, f"{name}.pickle.gz"), "wb") as f:
        pickle.dump(snapshot, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
