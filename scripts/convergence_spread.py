"""Seed-to-seed spread of the convergence tier: train cases under several seeds (weights, dropout and batch order;
the evaluation batches stay fixed) and write each run's validation curve and time-to-loss as JSON.

The convergence gate's tolerance on the final validation loss (gptcore.gate.schema.Tolerances.val_loss) comes from
this spread. Each run uses one thread; ``--jobs`` runs go side by side.

    python scripts/convergence_spread.py --out spread.json --jobs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gptcore, installed or not

from gptcore.cli.arguments import positive  # noqa: E402
from gptcore.config import Schedule  # noqa: E402
from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.presets import CPU_SHAPE_SHORT, STUDIES, get_model, get_recipe  # noqa: E402

SEEDS = (1337, 1, 2)
FULL = STUDIES["cpu-shape"].schedule
CASES: list[tuple[str, str, str, Schedule]] = [
    ("full", "cpu-small", recipe, FULL) for recipe in STUDIES["cpu-shape"].recipes
] + [("short", "cpu-small", "ckpt-fp32", CPU_SHAPE_SHORT)]


def run_one(job: tuple[str, str, str, Schedule, int]) -> dict:
    import dataclasses

    from gptcore.measure.convergence import converge

    schedule_name, model, recipe, schedule, seed = job
    start = time.perf_counter()
    result = converge(get_model(model), dataclasses.replace(get_recipe(recipe), seed=seed), schedule, "cpu", threads=1)
    print(
        f"{schedule_name} {model}-{recipe} seed {seed}: final val {result.final_val_loss:.4f}, "
        f"to {schedule.target_loss}: {result.time_to_loss()}, {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return {"schedule": schedule_name, "model": model, "recipe": recipe, "seed": seed, **result.to_json()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--jobs", type=positive, default=2, help="runs side by side (one thread each)")
    args = parser.parse_args(argv)
    why = unwritable(Path(args.out))
    if why:
        parser.exit(2, f"convergence_spread.py: --out {args.out}: {why}\n")
    jobs = [(s, m, r, sch, seed) for s, m, r, sch in CASES for seed in SEEDS]
    jobs.sort(key=lambda j: j[3].steps, reverse=True)  # the long runs first
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(run_one, jobs, chunksize=1)
    summary = {}
    for s, m, r, _ in CASES:
        finals = [run["val_loss"][-1] for run in runs if (run["schedule"], run["model"], run["recipe"]) == (s, m, r)]
        summary[f"{s} {m}-{r}"] = {
            "final_val_loss": finals,
            "range": max(finals) - min(finals),
            "stdev": statistics.stdev(finals),
        }
    import torch

    from gptcore.identity import cpu_model

    what = (
        f"scripts/convergence_spread.py: {len(runs)} runs, one thread each, on {cpu_model()}, torch {torch.__version__}"
    )
    with open(args.out, "w") as out:
        json.dump({"what": what, "seeds": SEEDS, "summary": summary, "runs": runs}, out, indent=1)
    for name, s in summary.items():
        print(
            f"{name}: {', '.join(f'{v:.4f}' for v in s['final_val_loss'])}; range {s['range']:.4f}, "
            f"stdev {s['stdev']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
