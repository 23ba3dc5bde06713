"""Benchmark cases on every rank of one torchrun job: ``python -m torch.distributed.run --nproc-per-node=2 -m
gptcore.measure.worker --model cpu-small --recipe ddp fsdp2 --out DIR``.

For each recipe in turn, each rank builds the case's Trainer (the first joins the process group), warms up, times
rounds, and writes its Measurement to ``DIR/<recipe>/rank-<r>.json``. One launch for several cases pays torchrun's
start and the ranks' imports once (most of a CPU case's time). Every rank's round times are the slowest rank's (a
step ends when the last rank ends it), so tokens/s is the whole job's: global tokens per step / median step time.
The loss is averaged over ranks (the single-process loss of the global batch); peak memory is the rank's own (on
CPU the tracked tensor peak of a separate pass, as for any case).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from gptcore.measure.runner import CaseRunner
from gptcore.presets import get_model, get_recipe
from gptcore.training.distributed import max_over_ranks, this_rank
from gptcore.training.trainer import resolve_device


def run(
    model: str, recipe_name: str, out: Path, *, device: str | None, warmup: int, rounds: int, steps_per_round: int
) -> dict:
    """Measure one case on this rank and write ``out/<recipe>/rank-<r>.json``; returns what was written."""
    cfg, recipe = get_model(model), get_recipe(recipe_name)
    runner = CaseRunner(cfg, recipe, resolve_device(device), warmup=warmup, steps_per_round=steps_per_round)
    runner.prepare()
    for _ in range(rounds):
        runner.round()
    runner.m.round_seconds = max_over_ranks(runner.m.round_seconds)
    runner.last_loss = runner.trainer.mean_loss(runner.last_loss)
    rank = runner.trainer.rank
    result = runner.finish().to_dict() | {"rank": rank.rank, "world_size": rank.world_size}
    where = out / recipe_name
    where.mkdir(parents=True, exist_ok=True)
    (where / f"rank-{rank.rank}.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gptcore.measure.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--recipe", required=True, nargs="+", help="one or more recipes, run in turn")
    parser.add_argument("--out", required=True, type=Path, help="directory for <recipe>/rank-<r>.json")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per timed round")
    args = parser.parse_args(argv)
    if this_rank().world_size < 2:
        parser.error("run under torchrun with --nproc-per-node >= 2")
    for recipe in args.recipe:
        run(
            args.model,
            recipe,
            args.out,
            device=args.device,
            warmup=args.warmup,
            rounds=args.rounds,
            steps_per_round=args.steps,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
