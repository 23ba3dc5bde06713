"""What the commands share: one-line usage errors, the argument types, the arguments that name a case
(``--model``, ``--recipe``, ``--set``) and those of a hunt (``-k``, ``--rounds``, ``--threshold``, ``--warmup``,
``--steps``), and the text of an exact check."""

from __future__ import annotations

import argparse
import typing

from gptcore.config import GPTConfig, Recipe
from gptcore.overrides import apply_assignments
from gptcore.presets import get_model, get_recipe
from gptcore.units import format_bytes


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # argparse prints usage + message; we want one line
        raise UsageError(message)


def positive(text: str) -> int:
    """An integer >= 1 (argparse names the flag in its message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def check_output(option: str, path: str | None, *, folder: bool = False) -> None:
    """UsageError, before any work, where ``path`` (a file the command writes, whose folder is made here, or with
    ``folder`` a folder it fills) could not be written: a long comparison or merge must not end in a traceback, or
    with its baselines recorded and its verdict lost. ``None``: the option was not given."""
    import os
    from pathlib import Path

    if path is None:
        return
    target = Path(path)
    if folder:
        if target.exists() and not target.is_dir():
            raise UsageError(f"{option} {path}: not a folder")
        existing = next(p for p in (target, *target.parents) if p.exists())  # what mkdir(parents=True) starts from
        if not existing.is_dir() or not os.access(existing, os.W_OK):
            raise UsageError(f"{option} {path}: cannot create it under {existing}")
        return
    from gptcore.gate.results import unwritable  # the pytest plugin's check of --results-log, the same rule

    why = unwritable(target)
    if why:
        raise UsageError(f"{option} {path}: {why}")


def interpreter(value: str) -> str:
    """An interpreter given as a path (relative to the cwd) or a name on PATH, made absolute: compare runs it in a
    temporary worktree. Not resolved through links: a venv's python is a link, and its venv is the point. Whether
    it exists and runs is compare's to say (one line)."""
    import os
    import shutil

    return os.path.abspath(value if os.sep in value else shutil.which(value) or value)


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --recipe and --set: the one definition of what names a case."""
    parser.add_argument("--model", required=True, help="model preset (see `list`)")
    parser.add_argument("--recipe", default="fp32", help="recipe (see `list`); default fp32")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        dest="assignments",
        help="change one Recipe field on top of the recipe, e.g. --set checkpoint=true "
        "--set grad_accum_steps=4; a nested field by its dotted name, e.g. "
        "--set parallel.fsdp2.reshard_after_forward=false (repeatable; "
        "None/true/false/numbers/names)",
    )


def add_hunt_arguments(parser: argparse.ArgumentParser) -> None:
    """-k, --rounds, --threshold, --warmup and --steps: what compare and bisect share."""
    parser.add_argument(
        "-k",
        dest="expr",
        required=True,
        metavar="EXPR",
        help="cases by id, as pytest -k: cpu-small-ckpt, 'cpu-small and not bf16'",
    )
    parser.add_argument("--rounds", type=positive, default=10, help="fresh-process rounds per revision (default 10)")
    parser.add_argument(
        "--threshold",
        type=fraction,
        default=0.05,
        help="smallest tokens/s change called slower/faster (default 0.05; it must also be significant)",
    )
    parser.add_argument("--warmup", type=positive, default=3, help="warm-up steps per round (default 3)")
    parser.add_argument("--steps", type=positive, default=10, help="timed steps per round (default 10)")


def case(args: argparse.Namespace) -> tuple[GPTConfig, Recipe, str]:
    """The model, the recipe with --set applied, and a label saying what ran."""
    cfg, recipe = get_model(args.model), get_recipe(args.recipe)
    recipe = apply_assignments(recipe, args.assignments)
    label = f"{args.model} / {args.recipe}" + "".join(f" --set {a}" for a in args.assignments)
    return cfg, recipe, label


def hunt_options(args: argparse.Namespace):  # (gptcore.hunt.compare.Options, imported here)
    from gptcore.hunt.compare import Options, local_device

    return Options(warmup=args.warmup, steps=args.steps, device=local_device())


def interval(speed) -> str:  # (gptcore.hunt.compare.Speed)
    if speed.low is None:
        return "95% CI n/a: too few rounds"
    return f"95% CI {speed.low:.3f}-{speed.high:.3f}"


def exact_text(check) -> str:  # (gptcore.gate.checks.Check: B measured against A)
    a, b = check.baseline, check.measured
    if a is None or b is None:
        return f"{check.metric} n/a"
    if check.metric == "loss":
        return f"loss {a:.7f} -> {b:.7f} {check.status}"
    change = f" ({check.delta:+.2%}, {b - a:+,} B)" if check.delta else ""
    return f"peak memory {format_bytes(a)} -> {format_bytes(b)}{change} {check.status}"
