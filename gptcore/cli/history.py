"""``history``: change points and creeping stretches over commits in pytest-benchmark's saved runs."""

from __future__ import annotations

import argparse
import sys

from gptcore.cli.arguments import UsageError, check_output

NAME = "history"
HELP = (
    "change points over commits in pytest-benchmark's saved runs: the "
    "creeping regression no single run fails, named by its commit range"
)


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-k",
        dest="expr",
        default=None,
        metavar="TEXT",
        help="only the cases whose name holds TEXT, e.g. cpu-small-ckpt-fp32",
    )
    parser.add_argument(
        "--storage", metavar="DIR", default=None, help="pytest-benchmark's storage (default: .benchmarks/<this device>)"
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="write every finding to FILE")
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        default=None,
        help="write the 'change points in history' section of the verdict to FILE",
    )


def run(args: argparse.Namespace) -> int:
    """Change points and creeping stretches in the saved runs; exit 1 when one is a regression or a creep, 2 when
    nothing can be analysed."""
    import json
    from pathlib import Path

    from gptcore.hunt import history

    if args.storage is None:
        from gptcore.identity import session_slug

        args.storage = f".benchmarks/{session_slug()}"
    check_output("--json", args.json)
    check_output("--markdown", args.markdown)
    found = history.analyse(args.storage, args.expr)
    for line in found.skipped:
        print(f"gptcore history: {line}", file=sys.stderr)
    if found.analysed == 0:
        if found.runs == 0:
            why = "every saved run was left out (see above)"
        elif found.series == 0:
            why = f"no case matching {args.expr!r}" if args.expr else "no case with a figure in the saved runs"
        else:
            why = "every series has too few points (see above)"
        raise UsageError(f"{args.storage}: nothing to analyse: {why}")
    print(
        f"{found.runs} saved run(s) of {len(found.commits)} commit(s), {found.analysed} series, "
        f"{len(found.findings)} change point(s) or creep(s) in {args.storage}"
    )
    for finding in found.findings:
        print(finding.line())
        if finding.command():
            print(f"  hunt it: {finding.command()}")
    for flag, path, text in (
        ("--json", args.json, lambda: json.dumps(found.to_json(), indent=1) + "\n"),
        ("--markdown", args.markdown, lambda: history.markdown(found)),
    ):
        if path:
            try:
                Path(path).write_text(text())
            except OSError as err:
                raise UsageError(f"{flag} {path}: {err.strerror or err}") from None
    return 1 if any(f.status in ("regression", "creeping") for f in found.findings) else 0
