"""Tokens/s against the batch for one recipe: is the batch that fills the device (``fit_memory``) the fastest?

    PYTHONPATH=$PWD python3 scripts/batch_sweep.py --recipe ladder-9 --batches 32,64,96,146 --json sweep.json

At a GPU's power cap the clock follows the work's power draw. On an H200 (docs/gpu.md) ladder-8 at a batch of 16 ran
at 1,860-1,920 MHz, and ladder-9 at its fitted batch of 146 at 1,605-1,620 MHz: the larger batch needed 19% fewer
device cycles a token and got 14% fewer cycles a second. Whether a batch between them is faster than both is what
this measures, one batch after another in one process on one device.

Each batch is one case of the suite's own measurement (``gptcore.measure.runner.run_case``: the warm-up with its
compile, the timed rounds with NVML's clocks sampled in each, one traced step's busy time, peak memory), with the
recipe's ``fit_memory`` replaced by that batch. A batch that runs out of memory is a row with its error; the rest go
on. Each batch's row is printed, and written to ``--json`` with the ones before it, as soon as it ends, so that a job
cut short keeps what it measured. The end table gives each batch's tokens/s, the rounds' median SM clock and power,
the busy time of a step, the device cycles a token (busy time x the traced step's SM clock / tokens a step), and the
peak allocated memory. On a CPU the GPU's columns are empty.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from gptcore.gate.results import unwritable
from gptcore.measure.measurement import Measurement
from gptcore.measure.runner import run_case
from gptcore.presets import get_model, get_recipe
from gptcore.training.trainer import UnsupportedRecipe, check_runnable, resolve_device


def batches(text: str) -> list[int]:
    """'32,64,96' as [32, 64, 96]; each at least 1."""
    try:
        values = [int(word) for word in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batches such as 32,64,96, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every batch must be at least 1, got {text!r}")
    return values


def row_of(batch: int, m: Measurement) -> dict:
    """One batch's figures from its Measurement (None where the device has none)."""
    clocks = m.clocks or {}
    busy, traced = m.gpu_busy_seconds, clocks.get("traced_sm_mhz")
    return {
        "batch": batch,
        "tokens_per_s": m.tokens_per_s,
        "sm_mhz": clocks.get("sm_mhz"),
        "power_w": clocks.get("power_w_median"),
        "flagged_rounds": m.flagged_rounds,
        "busy_ms": busy * 1e3 if busy else None,
        "traced_sm_mhz": traced,
        "cycles_per_token": busy * traced * 1e6 / m.tokens_per_step if busy and traced else None,
        "peak_allocated_bytes": m.peak_allocated_bytes,
        "error": m.error,
    }


def table(rows: list[dict]) -> str:
    from tabulate import tabulate

    def cell(value, spec: str) -> str:
        return "" if value is None else format(value, spec)

    cells = [
        [
            r["batch"],
            cell(r["tokens_per_s"], ",.0f"),
            cell(r["sm_mhz"], ",.0f"),
            cell(r["power_w"], ".0f"),
            cell(r["busy_ms"], ",.2f"),
            cell(r["cycles_per_token"], ",.0f"),
            cell(None if r["peak_allocated_bytes"] is None else r["peak_allocated_bytes"] / 2**30, ".2f"),
            r["error"] or "",
        ]
        for r in rows
    ]
    headers = ["batch", "tok/s", "SM MHz", "W", "busy ms", "cycles/token", "peak GiB", "error"]
    return tabulate(cells, headers=headers, disable_numparse=True, stralign="right")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--recipe", default="ladder-9")
    parser.add_argument("--batches", type=batches, required=True, help="comma-separated, in the order run")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps a round")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if min(args.warmup, args.rounds, args.steps) < 1:
        parser.exit(2, "batch_sweep.py: --warmup, --rounds and --steps must be at least 1\n")
    why = unwritable(args.json) if args.json else None
    if why:  # before the first batch: each row is written as it ends
        parser.exit(2, f"batch_sweep.py: --json {args.json}: {why}\n")
    try:
        cfg, recipe, device = get_model(args.model), get_recipe(args.recipe), resolve_device(args.device)
        check_runnable(recipe, device, cfg)
    except (ValueError, UnsupportedRecipe) as err:
        parser.exit(2, f"batch_sweep.py: {err}\n")
    if recipe.parallel.mode != "none":  # one process, one device
        parser.exit(2, f"batch_sweep.py: {args.recipe} runs under torchrun; the sweep takes a one-process recipe\n")
    recipe = dataclasses.replace(recipe, fit_memory=None)  # the batch is this sweep's
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    record = {"device": name, "torch": torch.__version__, "model": args.model, "recipe": args.recipe, "rows": []}
    for batch in args.batches:
        try:  # an out-of-memory is the row's error (run_case); a batch the recipe cannot split is the sweep's end
            m = run_case(
                dataclasses.replace(cfg, batch_size=batch),
                recipe,
                device,
                warmup=args.warmup,
                rounds=args.rounds,
                steps_per_round=args.steps,
            )
        except (ValueError, UnsupportedRecipe) as err:
            parser.exit(2, f"batch_sweep.py: batch {batch}: {err}\n")
        record["rows"].append(row_of(batch, m))
        print(table(record["rows"][-1:]).splitlines()[-1], flush=True)
        if args.json:
            args.json.write_text(json.dumps(record, indent=1))
        del m
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"{name}, torch {torch.__version__}: {args.model} / {args.recipe} at each batch")
    print(table(record["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
