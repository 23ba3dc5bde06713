"""Command line: python -m gptcore {list, train, estimate, report}. Bad input: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from . import memory
from .config import MODEL_NOTES, MODELS, RECIPE_NOTES, RECIPES, get_model, get_recipe


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + message; we want one line
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m gptcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="every model and recipe, one line each")

    train = sub.add_parser("train", help="train a named model with a named recipe")
    train.add_argument("--model", required=True, help="model preset (see `list`)")
    train.add_argument("--recipe", default="fp32", help="recipe (see `list`); default fp32")
    train.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    train.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if present, else cpu")
    train.add_argument("--batch", type=int, default=None, help="override the model's batch size")
    train.add_argument("--log-every", type=int, default=10, help="read the loss every N steps (default 10)")

    # estimate: memory.add_estimate_arguments / memory.cmd_estimate (owned by gptcore/memory.py)
    memory.add_estimate_arguments(sub)
    # report: report.add_report_arguments / report.cmd_report (owned by gptcore/report.py)
    from .report import add_report_arguments
    add_report_arguments(sub)
    return parser


def cmd_list(_: argparse.Namespace) -> int:
    from tabulate import tabulate

    print(tabulate([(name, MODEL_NOTES[name]) for name in MODELS], headers=["model", "what"]))
    print()
    print(tabulate([(name, RECIPE_NOTES[name]) for name in RECIPES], headers=["recipe", "what"]))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    import torch
    from tqdm import tqdm

    from .measure import process_peak_memory
    from .train import Trainer, resolve_device

    cfg, recipe = get_model(args.model), get_recipe(args.recipe)
    if args.steps < 1:
        raise UsageError("--steps must be >= 1")
    if args.batch is not None:
        cfg = dataclasses.replace(cfg, batch_size=args.batch)
    device = resolve_device(args.device)
    trainer = Trainer(cfg, recipe, device)
    start, first = time.perf_counter(), None
    bar = tqdm(total=args.steps, unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_log(step: int, loss: float) -> None:
        nonlocal first
        first = loss if first is None else first
        tok_s = step * trainer.tokens_per_step / (time.perf_counter() - start)
        peak, kind = process_peak_memory(device)
        bar.set_postfix_str(f"loss {loss:.4f} | {tok_s:,.0f} tok/s | peak {kind} {peak / 2**20:,.0f} MiB")
        bar.update(step - bar.n)

    try:
        losses = trainer.run(args.steps, log_every=max(1, args.log_every), on_log=on_log)
    except torch.OutOfMemoryError:
        bar.close()
        peak, kind = process_peak_memory(device)
        print(f"error: out of memory on {device} after step {trainer.step_count} (peak {kind} "
              f"{peak / 2**30:.2f} GiB)", file=sys.stderr)
        return 1
    bar.close()
    seconds = time.perf_counter() - start
    peak, kind = process_peak_memory(device)
    print(f"{args.model} / {args.recipe} on {device}: {args.steps} steps in {seconds:.1f} s "
          f"({1000 * seconds / args.steps:.1f} ms/step, {args.steps * trainer.tokens_per_step / seconds:,.0f} tok/s, "
          f"compile included), loss {first:.4f} -> {losses[-1]:.4f}, peak {kind} {peak / 2**20:,.0f} MiB")
    return 0


COMMANDS = {"list": cmd_list, "train": cmd_train, "estimate": memory.cmd_estimate,
            "report": lambda args: args.handler(args)  # report.cmd_report, set by add_report_arguments
            }


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, ValueError) as err:  # UnsupportedRecipe is a ValueError
        print(f"gptcore: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m gptcore list | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
