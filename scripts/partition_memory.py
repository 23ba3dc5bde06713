"""What torch.compile's partitioner plans for one training step of a model under compiled recipes: the bytes saved
for backward and the peak of live bytes along the forward and backward graphs (gptcore.memory.partition).

    python scripts/partition_memory.py --model deep-1.6b [--recipes compile budget-0.60 budget-0.05] [--device cuda]
        [--json FILE]

Each recipe compiles only up to the partition (no kernels, no step), in a process of its own so that one recipe's
compile cannot leak into the next. A plan whose backward peak is far above the others' points at the partitioner;
compare with the measured peak (``pytest bench -k memory``) and the estimate (``python -m gptcore estimate``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from dataclasses import asdict
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gptcore, installed or not

from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.memory.partition import check_plannable  # noqa: E402
from gptcore.presets import get_model, get_recipe  # noqa: E402
from gptcore.units import common_unit, format_bytes  # noqa: E402

SIZES = ("input_bytes", "saved_bytes", "forward_peak_bytes", "backward_peak_bytes")


def _plan(model: str, recipe: str, device: str | None) -> dict:
    from gptcore.memory.partition import plan
    from gptcore.training.trainer import resolve_device

    return asdict(plan(get_model(model), get_recipe(recipe), resolve_device(device)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deep-1.6b")
    parser.add_argument("--recipes", nargs="+", default=["compile", "budget-0.60", "budget-0.05"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", default=None, help="also write the plans here")
    args = parser.parse_args()
    why = unwritable(Path(args.json)) if args.json else None
    if why:  # before anything compiles: the plans must not be lost at the end
        print(f"partition_memory: --json {args.json}: {why}", file=sys.stderr)
        return 2
    try:  # bad names and uncompiled recipes are refused before anything compiles
        get_model(args.model)
        recipes = {name: get_recipe(name) for name in args.recipes}
        for name, recipe in recipes.items():
            check_plannable(recipe, name)
    except ValueError as err:
        print(f"partition_memory: {err}", file=sys.stderr)
        return 2
    plans = {}
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        for recipe in args.recipes:
            try:
                p = pool.apply(_plan, (args.model, recipe, args.device))
            except (ValueError, RuntimeError) as err:
                print(f"partition_memory: {args.model} × {recipe}: {err}", file=sys.stderr)
                return 2
            plans[recipe] = p
    unit = common_unit(p["input_bytes"] for p in plans.values())
    rows = [
        [recipe]
        + [format_bytes(p[k], unit) for k in SIZES]
        + [
            f"{p['backward_peak_at']:.2f}",
            format_bytes(p["gradients_at_backward_peak"], unit),
            p["recomputed_ops"],
            p["recomputed_matmuls"],
        ]
        for recipe, p in plans.items()
    ]
    print(
        f"{args.model}: the partitioner's plan (live bytes in graph order, before inductor; the forward's inputs, "
        f"parameters and batch, apart)"
    )
    print(
        tabulate(
            rows,
            headers=[
                "recipe",
                "inputs",
                "saved for bwd",
                "fwd peak",
                "bwd peak",
                "bwd peak at",
                "grads at it",
                "ops recomputed",
                "matmuls recomputed",
            ],
            disable_numparse=True,
        )
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "plans": plans}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
