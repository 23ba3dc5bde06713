"""``report``: tables (``--plot``: charts; ``--html``: one page) from a ``pytest --benchmark-json`` file."""

from __future__ import annotations

import argparse
from pathlib import Path

from gptcore.cli.arguments import UsageError, check_output

NAME = "report"
HELP = "tables (and --plot charts) from a pytest --benchmark-json file"


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN.json", help="a file written by pytest bench --benchmark-json=RUN.json")
    parser.add_argument(
        "--plot",
        metavar="DIR",
        default=None,
        help="also write PNG charts into DIR (needs matplotlib: pip install 'gptcore-bench[plot]')",
    )
    parser.add_argument(
        "--html",
        metavar="OUT.html",
        default=None,
        help="also write one self-contained HTML page: each case vs its baseline, the memory "
        "breakdown, the ladder, the history (needs matplotlib)",
    )
    parser.add_argument(
        "--baselines", metavar="DIR", default=None, help="baseline files for --html (default ./baselines, if there)"
    )
    parser.add_argument(
        "--history", metavar="DIR", default=None, help="pytest-benchmark saved runs for --html, e.g. .benchmarks/cpu"
    )


def run(args: argparse.Namespace) -> int:
    from gptcore.report.tables import load_run, plot, render

    for flag, value in (("--plot", args.plot), ("--html", args.html)):
        if value is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError(
                    f"{flag} needs matplotlib, which is not installed: pip install 'gptcore-bench[plot]'"
                ) from None
    check_output("--plot", args.plot, folder=True)
    check_output("--html", args.html)
    if args.baselines is not None and not Path(args.baselines).is_dir():  # a page without them would not say why
        what = "not a directory" if Path(args.baselines).exists() else "no such directory"
        raise UsageError(f"--baselines {args.baselines}: {what}")
    records = load_run(args.run)
    print(render(records))
    try:
        if args.plot is not None:
            for path in plot(records, args.plot):
                print(f"wrote {path}")
        if args.html is not None:
            from gptcore.report.html import write_html

            page = write_html(args.run, args.html, baselines_dir=args.baselines or "baselines", history=args.history)
            print(f"wrote {page}")
    except OSError as err:
        raise UsageError(f"cannot write {err.filename or 'the report'}: {err.strerror or err}") from None
    return 0
