"""``train``: train a named model with a named recipe (``--set`` on top), with a progress bar; an
out-of-memory run is one line and exit code 1."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from gptcore.cli.arguments import add_case_arguments, case, positive
from gptcore.config import Schedule
from gptcore.units import format_bytes

NAME = "train"
HELP = "train a named model with a named recipe"


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    add_case_arguments(parser)
    parser.add_argument("--steps", type=positive, default=100, help="optimizer steps (default 100)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if present, else cpu")
    parser.add_argument("--batch", type=positive, default=None, help="override the model's batch size")
    parser.add_argument(
        "--log-every",
        type=positive,
        default=10,
        help="read the loss every N steps (a host-device sync each; default 10)",
    )
    parser.add_argument(
        "--eval-every",
        type=positive,
        default=None,
        metavar="N",
        help="read the validation loss every N steps, at step 0 and at the end (eval mode, fixed "
        "batches); the summary gives the final one",
    )
    parser.add_argument(
        "--eval-batches",
        type=positive,
        default=20,
        metavar="K",
        help="validation batches per evaluation (the model's batch size each; default 20)",
    )


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from gptcore.measure.convergence import train_and_evaluate
    from gptcore.measure.runner import out_of_memory_in
    from gptcore.measure.timing import process_peak_memory
    from gptcore.memory.fit import fitted
    from gptcore.training.trainer import Trainer, resolve_device

    cfg, recipe, label = case(args)
    if args.batch is not None:
        cfg = dataclasses.replace(cfg, batch_size=args.batch)
    device = resolve_device(args.device)
    if args.batch is None and recipe.fit_memory is not None:  # the batch that fills the device
        cfg = fitted(cfg, recipe, device.type)
        print(f"fit_memory {recipe.fit_memory}: batch {cfg.batch_size}", file=sys.stderr)
    try:
        trainer = Trainer(cfg, recipe, device)
    except Exception as err:  # only an OOM is handled, as below
        if out_of_memory_in(err) is None:
            raise
        print(f"gptcore: error: out of memory on {device} building the model and its optimizer", file=sys.stderr)
        return 1
    device, world, main = trainer.device, trainer.rank.world_size, trainer.rank.is_main  # under torchrun: rank 0 prints
    start, first = time.perf_counter(), None
    bar = tqdm(total=args.steps, unit="step", file=sys.stderr, dynamic_ncols=True, disable=not main)

    def on_log(step: int, loss: float) -> None:
        nonlocal first
        first = loss if first is None else first
        tok_s = step * trainer.tokens_per_step / (time.perf_counter() - start)
        peak, kind = process_peak_memory(device)
        bar.set_postfix_str(f"loss {loss:.4f} | {tok_s:,.0f} tok/s | peak {kind} {format_bytes(peak)}")
        bar.update(step - bar.n)

    def on_eval(step: int, val: float, train: float | None) -> None:
        nonlocal first
        first = train if first is None else first
        bar.write(
            f"step {step:>6,}: val loss {val:.4f}"
            + (f" | train loss {train:.4f} (mean since the last evaluation)" if train is not None else "")
        )
        if train is not None:
            on_log(step, train)

    val = None
    try:
        if args.eval_every:  # training is timed apart from the evaluations
            schedule = Schedule(steps=args.steps, eval_every=args.eval_every, eval_batches=args.eval_batches)
            run = train_and_evaluate(trainer, schedule, on_eval)
            losses, val, seconds = [x for x in run.train_loss if x is not None], run.final_val_loss, run.seconds[-1]
        else:
            losses = trainer.run(args.steps, log_every=args.log_every, on_log=on_log)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the line that says so starts a line of its own (gptcore.cli)
        bar.close()
        raise
    except Exception as err:  # only an OOM (also one raised while compiling) is handled
        bar.close()  # any error's line starts a line of its own, not the progress bar's
        if out_of_memory_in(err) is None:
            raise
        peak, kind = process_peak_memory(device)
        print(
            f"gptcore: error: out of memory on {device} after step {trainer.step_count} (peak {kind} "
            f"{format_bytes(peak)})",
            file=sys.stderr,
        )
        return 1
    bar.close()
    if val is None:
        seconds = time.perf_counter() - start
    peak, kind = process_peak_memory(device)
    timing = f"{1000 * seconds / args.steps:.1f} ms/step, {args.steps * trainer.tokens_per_step / seconds:,.0f} tok/s"
    if recipe.compile:
        timing += ", compile included"
    if not main:
        return 0
    if recipe.parallel.mode != "none":
        device = f"{world} ranks x {device} ({recipe.parallel.mode}, world size {world}; peak of rank 0)"
    if val is None:
        what = f"loss {first:.4f} at step 1 -> {losses[-1]:.4f} at step {args.steps}"
    else:
        what = (
            f"train loss {first:.4f} over the first {min(args.eval_every, args.steps)} steps -> {losses[-1]:.4f} over "
            "the last, "
            f"validation loss {val:.4f} at step {args.steps} (evaluations not timed)"
        )
    print(
        f"{label} on {device}: {args.steps} steps in {seconds:.1f} s ({timing}), {what}, peak {kind} "
        f"{format_bytes(peak)}"
    )
    return 0
