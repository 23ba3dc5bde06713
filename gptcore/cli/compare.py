"""``compare``: two revisions, or one under two interpreters, in interleaved fresh-process rounds per case;
exit 1 when a case is slower or its memory, loss or work moved."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from gptcore.cli.arguments import (
    UsageError,
    add_hunt_arguments,
    check_output,
    exact_text,
    hunt_options,
    interpreter,
    interval,
)

NAME = "compare"
HELP = (
    "is HEAD slower than BASE on this machine (or B's Python environment "
    "than A's)? interleaved fresh-process rounds of both, per case"
)


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "base",
        metavar="BASE",
        nargs="?",
        default=None,
        help="git revision A (resolved in the repository of the cwd); leave it out with "
        "--python-a/--python-b to run the working tree under both interpreters",
    )
    parser.add_argument(
        "head",
        metavar="HEAD",
        nargs="?",
        default=None,
        help="git revision B (default: the working tree as it is, uncommitted changes included)",
    )
    add_hunt_arguments(parser)
    parser.add_argument("--json", metavar="FILE", default=None, help="write every figure to FILE")
    parser.add_argument(
        "--python-a",
        metavar="PATH",
        default=None,
        type=interpreter,
        help="the interpreter that runs A, e.g. venv-old/bin/python (default: this one)",
    )
    parser.add_argument(
        "--python-b",
        metavar="PATH",
        default=None,
        type=interpreter,
        help="the interpreter that runs B, e.g. venv-new/bin/python with another torch",
    )


def run(args: argparse.Namespace) -> int:
    """Interleaved rounds of BASE and HEAD per case; exit 1 when a case is slower or its memory/loss fails."""
    import json

    from gptcore.hunt.compare import compare, to_json
    from gptcore.measure.clocks import BUSY_SHARE

    def progress(result, done: int, total: int) -> None:  # (gptcore.hunt.compare.CaseResult)
        a, b = result.tokens("a"), result.tokens("b")
        ratio = sorted(b)[len(b) // 2] / sorted(a)[len(a) // 2]
        print(
            f"{result.case}: round {done}/{total}: A {a[-1]:,.0f} B {b[-1]:,.0f} tok/s, running B/A {ratio:.3f}",
            file=sys.stderr,
            flush=True,
        )

    check_output("--json", args.json)
    start = time.perf_counter()
    try:
        a, b, results = compare(
            args.base,
            args.head,
            args.expr,
            rounds=args.rounds,
            threshold=args.threshold,
            options=hunt_options(args),
            progress=progress,
            python_a=args.python_a,
            python_b=args.python_b,
        )
    except KeyboardInterrupt:
        print("gptcore: interrupted (temporary worktrees removed)", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - start

    def side(rev) -> str:  # (gptcore.hunt.compare.Revision)
        where = f"{rev.label}" + (f" ({rev.sha[:10]})" if rev.sha else "")
        return where + (f", torch {rev.torch} ({rev.python})" if args.python_a or args.python_b else "")

    print(
        f"A = {side(a)}, B = {side(b)}; {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up, "
        f"{seconds:.0f} s"
    )
    for r in results:
        if r.error:
            print(f"{r.case}: error: {r.error}")
            continue
        s = r.speed
        work = "work n/a" if r.work is None else "work =" if not r.work else "work: " + ", ".join(r.work)
        print(
            f"{r.case}: A {s.median_a:,.0f} tok/s, B {s.median_b:,.0f} tok/s, B/A {s.ratio:.3f} ({interval(s)}, "
            f"p {s.p:.2g}) {s.verdict}; {exact_text(r.memory)}; {exact_text(r.loss)}; {work}"
        )
        if r.busy:
            print(f"  GPU busy: {r.busy.status}: {r.busy.note}")
        if r.setup:
            print(f"  note: B's setup differs from A's: {'; '.join(r.setup)} (B measures another experiment)")
        shares = [[x["cpu_share"] for x in rounds if x.get("cpu_share")] for rounds in (r.rounds_a, r.rounds_b)]
        if all(shares):
            share_a, share_b = (statistics.median_high(x) for x in shares)
            if min(share_a, share_b) < BUSY_SHARE:
                print(
                    f"  note: busy machine: median CPU share A {share_a:.2f}, B {share_b:.2f} (below "
                    f"~{BUSY_SHARE} other processes took the cores; tokens/s says little)"
                )
    if args.json:
        data = to_json(
            a,
            b,
            results,
            rounds=args.rounds,
            threshold=args.threshold,
            warmup=args.warmup,
            steps=args.steps,
            seconds=seconds,
        )
        try:
            with open(args.json, "w") as f:
                json.dump(data, f, indent=1)
        except OSError as err:
            raise UsageError(f"--json {args.json}: {err.strerror or err}") from None
    return 1 if any(r.failed for r in results) else 0
