"""``bisect``: the first commit between GOOD and BAD that is worse than GOOD on one metric."""

from __future__ import annotations

import argparse
import sys

from gptcore.cli.arguments import add_hunt_arguments, exact_text, hunt_options

NAME = "bisect"
HELP = "git bisect run for the first commit worse than GOOD on one metric"


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    from gptcore.hunt import bisection  # no torch: the choices of --metric

    parser.add_argument("good", metavar="GOOD", help="a revision with the good figure")
    parser.add_argument("bad", metavar="BAD", help="a later revision with the bad figure")
    add_hunt_arguments(parser)
    parser.add_argument(
        "--metric",
        choices=bisection.METRICS,
        default="tokens_per_s",
        help="tokens_per_s: compare's verdict slower is bad; peak_memory, loss: beyond the gate's "
        "tolerance of GOOD's figure is bad (exact, deterministic)",
    )


def run(args: argparse.Namespace) -> int:
    """The first commit between GOOD and BAD that is worse than GOOD on --metric."""
    from gptcore.hunt.bisection import bisect

    try:
        result = bisect(
            args.good,
            args.bad,
            args.expr,
            metric=args.metric,
            rounds=args.rounds,
            threshold=args.threshold,
            options=hunt_options(args),
            progress=lambda line: print(f"gptcore bisect: {line}", file=sys.stderr, flush=True),
        )
    except KeyboardInterrupt:
        print("gptcore: interrupted (temporary worktrees removed)", file=sys.stderr)
        return 130
    if result.first_bad is None:
        print(result.subject)
        return 1
    print(f"first bad commit: {result.first_bad} {result.subject}")
    for case, figures in result.figures.items():
        if args.metric == "tokens_per_s":
            print(
                f"  {case}: {figures['median_b']:,.0f} tok/s vs GOOD's {figures['median_a']:,.0f} "
                f"(B/A {figures['ratio']:.3f}, {figures['verdict']})"
            )
        else:
            from gptcore.gate.checks import Check

            print(f"  {case}: {exact_text(Check(**figures))} (GOOD -> first bad)")
    return 0
