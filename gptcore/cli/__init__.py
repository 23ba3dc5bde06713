"""The command line: ``python -m gptcore {list, train, estimate, report, compare, bisect, history, merge}``.

One module per command (as asv keeps its commands): each has its ``NAME``, ``HELP``, ``setup_arguments(parser)`` and
``run(args) -> exit code``. Every command's arguments are parsed with no torch imported until a command runs
(``--help`` and ``list`` stay fast). Bad input is one line on stderr and exit code 2; an out-of-memory run is one
line and exit code 1. SIGTERM (a CI job's time-out, ``kill``) is taken as Ctrl-C, so that compare and bisect remove
their temporary worktrees on either; either is one line and exit code 130.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

from gptcore.cli import bisect, compare, estimate, history, listing, merge, report, train
from gptcore.cli.arguments import Parser, UsageError
from gptcore.overrides import OverrideError, apply_assignments
from gptcore.presets import get_model, get_recipe

COMMANDS = (listing, train, estimate, report, compare, bisect, history, merge)
"""In the order ``--help`` lists them."""

__all__ = ["COMMANDS", "OverrideError", "UsageError", "apply_assignments", "get_model", "get_recipe", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m gptcore", description="gptcore: train, estimate and report GPT training recipes (see README.md)"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.setup_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # (warnings' API)
    return f"gptcore: warning: {message}\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM raises KeyboardInterrupt while a command runs: Python's default ends the process at once, and no
    ``finally`` (a worktree's removal) runs. Only the main thread can set a handler; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    warnings.formatwarning = _one_line_warning  # a deprecated recipe name: one line, not a source excerpt
    try:
        args = _parser().parse_args(argv)
        with _terminate_as_interrupt():
            return next(c for c in COMMANDS if c.NAME == args.command).run(args)
    except (UsageError, ValueError) as err:  # UnsupportedRecipe is a ValueError
        print(f"gptcore: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m gptcore list | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM in a command with nothing of its own to say (train, history)
        print("gptcore: interrupted", file=sys.stderr)
        return 130
