"""``estimate``: the memory breakdown of a training step, by arithmetic (``--simulate``: also on fake tensors)."""

from __future__ import annotations

import argparse
import dataclasses

from gptcore.cli.arguments import UsageError, add_case_arguments, case, positive

NAME = "estimate"
HELP = "memory breakdown of a training step: analytic, optionally simulated"


def share(text: str) -> float:
    """A share of the device's memory: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    add_case_arguments(parser)
    parser.add_argument(
        "--batch", type=positive, default=None, help="sequences per optimizer step (default: the preset's)"
    )
    parser.add_argument("--seq", type=positive, default=None, help="context length (default: the preset's block_size)")
    parser.add_argument("--checkpoint", action="store_true", help="add activation checkpointing to the recipe")
    parser.add_argument("--simulate", action="store_true", help="also simulate two iterations on fake tensors")
    parser.add_argument(
        "--fit",
        type=share,
        default=None,
        metavar="SHARE",
        help="the largest batch whose estimated peak fits this share of the device's memory (0 < SHARE <= 1)",
    )
    parser.add_argument(
        "--capacity",
        type=positive,
        default=None,
        metavar="BYTES",
        help="the device's memory for --fit (default: this machine's GPU, or its RAM for --device cpu)",
    )
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="device to estimate for (default cuda)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the breakdown, the phase of the peak and the states per parameter."""
    from gptcore.memory import estimate, resolve, simulate
    from gptcore.units import common_unit, in_unit

    cfg, recipe, label = case(args)
    if args.checkpoint:
        recipe = dataclasses.replace(recipe, checkpoint=True)
        label += " + checkpoint"
    fit = None
    if args.fit is not None or recipe.fit_memory is not None:
        if args.batch is not None:
            raise UsageError("--batch and --fit (or a recipe's fit_memory) both choose the batch; give one")
        from gptcore.memory.fit import device_memory, fit_batch

        capacity = args.capacity or device_memory(args.device)
        shaped = dataclasses.replace(cfg, block_size=args.seq or cfg.block_size)
        fit = fit_batch(shaped, recipe, args.device, capacity, share=args.fit)
        args.batch = fit.batch
    elif args.capacity is not None:  # it would be ignored without a word
        raise UsageError("--capacity is the memory --fit fills: give --fit SHARE with it")
    question = resolve(cfg, recipe, batch=args.batch, seq=args.seq, device=args.device)
    est = estimate(question)
    sim = simulate(question) if args.simulate else None
    cfg, recipe = question.cfg, question.recipe
    batch, micro = recipe.batch_size(cfg), recipe.micro_batch(cfg)
    batch_text = f"batch {batch}" + (f" ({recipe.grad_accum_steps} x {micro})" if micro != batch else "")
    print(f"{label} on {args.device}: {est.num_params / 1e6:,.1f}M parameters, {batch_text}, seq {cfg.block_size}")
    print(est.table(sim))
    states, n = est.states, est.num_params
    copies = states.get("weight copies", 0)
    copies_text = f" (+ {copies / n:.1f} in autocast's weight copies)" if copies else ""
    saved = est.at_forward_end
    unit = common_unit([saved.get("activations", 0), saved.get("logits and loss", 0)])
    print(
        f"states: {est.bytes_per_param:.1f} bytes/parameter = parameters {states['parameters'] / n:.0f} + "
        f"gradients {states['gradients'] / n:.0f} + optimizer state {states['optimizer state'] / n:.0f}"
        f"{copies_text}; saved by the forward: activations {in_unit(saved.get('activations', 0), unit):,.2f} "
        f"{unit}, logits and loss {in_unit(saved.get('logits and loss', 0), unit):,.2f} {unit}"
    )
    if fit is not None:
        print(
            f"fit: batch {fit.batch} is the largest whose estimated peak ({fit.peak_bytes:,} B) fits "
            f"{fit.budget_bytes:,} B of the device's memory"
        )
    for note in est.notes:
        print(f"note: {note}")
    if sim:
        print(f"note: simulation: {sim.method}" + "".join(f"; {n}" for n in sim.notes if n not in est.notes))
    return 0
