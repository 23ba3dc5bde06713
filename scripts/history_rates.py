"""The rates behind docs/history.md, measured with the tests' own generator (tests/test_history.py ``series``):
how often ``gptcore.hunt.history`` finds a step or a creep, how often its commit range holds the commit that made the
change, how often it reports a change where there is none, and asv's step detector (``asv.step_detect.detect_steps``,
if installed: ``pip install asv``) on the same series, side by side.

    python scripts/history_rates.py [--seeds 1000] [--first-seed 1000] [-k TEXT] [--jobs N] [--set NAME=VALUE]

Each row is one scenario over ``--seeds`` seeded series (seeds first-seed, first-seed + 1, ...); ``-k`` keeps the
scenarios whose name holds TEXT; ``--set PENALTY=4`` measures what another threshold would find. Prints a markdown
table, and on stderr how long it took (docs/history.md has the figures and the time).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    from tabulate import tabulate

    from gptcore.hunt import changepoints, history
    from tests.test_history import series
except ModuleNotFoundError as err:  # one line, never a traceback
    sys.exit(f"history_rates.py: {sys.executable} lacks {err.name}: pip install -e '.[dev]' first")


@dataclass(frozen=True)
class Scenario:
    name: str
    make: Callable[[int], list]
    """seed -> the series (tests.test_history.Point list)."""
    change_at: int | None
    """The first commit that made the change (None: step-free)."""
    change_end: int | None = None
    """The last commit of a creep (a step: change_at)."""
    metric: str = "tokens/s"
    tolerance: float = 0.05


SCENARIOS = [
    Scenario("3% drop at commit 16 of 24, CV 0.6%", lambda s: series(24, 0.006, step_at=16, step=-0.03, seed=s), 16),
    Scenario("3% drop at commit 16 of 24, CV 2.7%", lambda s: series(24, 0.027, step_at=16, step=-0.03, seed=s), 16),
    Scenario("10% drop at commit 16 of 24, CV 2.7%", lambda s: series(24, 0.027, step_at=16, step=-0.10, seed=s), 16),
    Scenario("3% drop at commit 3 of 6, CV 0.6%", lambda s: series(6, 0.006, step_at=3, step=-0.03, seed=s), 3),
    Scenario("3% drop at commit 4 of 8, CV 0.6%", lambda s: series(8, 0.006, step_at=4, step=-0.03, seed=s), 4),
    Scenario(
        "-1%/commit creep over 6 commits from 10 of 24, CV 0.6%",
        lambda s: series(24, 0.006, creep=(10, -0.01, 6), seed=s),
        10,
        15,
    ),
    Scenario(
        "-1%/commit creep over 6 commits from 20 of 50, CV 0.6%",
        lambda s: series(50, 0.006, creep=(20, -0.01, 6), seed=s),
        20,
        25,
    ),
    Scenario(
        "-2%/commit creep over 3 commits from 12 of 24, CV 0.6%",
        lambda s: series(24, 0.006, creep=(12, -0.02, 3), seed=s),
        12,
        14,
    ),
    Scenario(
        "-1%/commit creep over 20 commits from 15 of 50, CV 0.6%",
        lambda s: series(50, 0.006, creep=(15, -0.01, 20), seed=s),
        15,
        34,
    ),
    Scenario("step-free, 50 points, CV 0.6%, tokens/s", lambda s: series(50, 0.006, seed=s), None),
    Scenario("step-free, 50 points, CV 2.7%, tokens/s", lambda s: series(50, 0.027, seed=s), None),
    Scenario(
        "step-free, 50 points, CV 0.6%, peak memory",
        lambda s: series(50, 0.006, seed=s),
        None,
        metric="peak memory",
        tolerance=0.02,
    ),
    Scenario(
        "step-free, 50 points, CV 2.7%, peak memory",
        lambda s: series(50, 0.027, seed=s),
        None,
        metric="peak memory",
        tolerance=0.02,
    ),
]


THRESHOLDS = ("MIN_STEP", "PENALTY", "P_MAX", "Z_TAIL", "AMBIGUOUS", "WINDOW", "Z_CREEP", "CV_PLACE", "Z_PLACE")
"""The thresholds --set may change: those gptcore.hunt.changepoints reads when it runs."""


def _out_of_range(name: str, value: float) -> str | None:
    """Why ``value`` cannot be threshold ``name`` (None: it can): finite, above 0 (AMBIGUOUS and CV_PLACE may be 0),
    P_MAX at most 1, WINDOW a whole number of changes."""
    floor_ok = value >= 0 if name in ("AMBIGUOUS", "CV_PLACE") else value > 0
    if not math.isfinite(value) or not floor_ok:
        return f"must be a finite number {'>= 0' if name in ('AMBIGUOUS', 'CV_PLACE') else '> 0'}"
    if name == "P_MAX" and value > 1:
        return "a significance is at most 1"
    if name == "WINDOW" and value != int(value):
        return "a whole number of commit-to-commit changes"
    return None


def within(before: str, after: str, scenario: Scenario) -> bool:
    """The range (before, after] holds a commit that made the change (a creep: any of its commits)."""
    first, last = scenario.change_at, scenario.change_end or scenario.change_at
    return int(before[1:]) < last and int(after[1:]) >= first


def asv_steps(points: list) -> list[int] | None:
    """The indices where asv's detect_steps starts a new segment (None without asv)."""
    try:
        from asv.step_detect import detect_steps
    except ModuleNotFoundError:
        return None
    steps = detect_steps([p.value for p in points])
    return [left for left, *_ in steps[1:]]


def count(index: int, seeds: range) -> Counter:
    """The counts of one scenario over ``seeds`` (a worker's share)."""
    scenario, out = SCENARIOS[index], Counter()
    for seed in seeds:
        points = scenario.make(seed)
        started = time.process_time()
        findings = history.changes("c", scenario.metric, points, scenario.tolerance)
        out["cpu µs"] += round(1e6 * (time.process_time() - started))
        out["found"] += bool(findings)
        out["with a creep"] += any(f.kind == "creep" for f in findings)
        out["creeps"] += sum(f.kind == "creep" for f in findings)
        if scenario.change_at is not None:
            for f in findings:
                held = within(f.before, f.after, scenario)
                if f.uncertain:
                    out["uncertain"] += 1
                    out["uncertain creeps"] += f.kind == "creep"
                    out["uncertain held"] += held
                    out["hunt held"] += within(*f.hunt, scenario)
                else:
                    out["certain"] += 1
                    out["certain held"] += held
        cuts = asv_steps(points)
        if cuts is None:
            out["no asv"] = 1
        elif cuts:
            out["asv"] += 1
            out["asv held"] += scenario.change_at in cuts
    return out


CPU = Counter()
"""history's own CPU time (µs) and series, over the rows measured."""


def measure(index: int, seeds: range, pool: ProcessPoolExecutor | None = None, jobs: int = 1) -> list[str]:
    """One row of the table: scenario ``index`` over ``seeds``, shared among ``pool``'s ``jobs`` processes if
    given."""
    scenario, n = SCENARIOS[index], len(seeds)
    if pool is None:
        c = count(index, seeds)
    else:
        c = sum(pool.map(count, [index] * jobs, [seeds[i::jobs] for i in range(jobs)]), Counter())
    CPU.update({"µs": c["cpu µs"], "series": n})
    step = scenario.change_at is not None
    creeps = f" ({c['with a creep']} with a creep)" if c["with a creep"] else ""
    uncertain = (
        f"{c['uncertain']}" + (f" ({c['uncertain creeps']} creeps)" if c["uncertain creeps"] else "")
        + (f": range holds it in {c['uncertain held']}, hunt in {c['hunt held']}" if c["uncertain"] else "")
    )  # fmt: skip
    return [
        scenario.name,
        f"{c['found']} / {n}{creeps}",
        f"{c['certain held']} / {c['certain']}" if step else "—",
        uncertain if step else "—",
        "no asv" if c["no asv"] else f"{c['asv']} / {n}" + (f" ({c['asv held']})" if step else ""),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("-k", dest="select", default="", help="only the scenarios whose name holds this text")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another value for one of gptcore.hunt.changepoints' thresholds (THRESHOLDS): what it would find instead",
    )
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        print("history_rates.py: --seeds and --jobs must be at least 1", file=sys.stderr)
        return 2
    for setting in args.set:
        name, _, value = setting.partition("=")
        if name not in THRESHOLDS:
            print(f"history_rates.py: --set {setting}: not one of {', '.join(THRESHOLDS)}", file=sys.stderr)
            return 2
        try:
            number = float(value)
        except ValueError:
            print(f"history_rates.py: --set {setting}: {value!r} is not a number", file=sys.stderr)
            return 2
        why = _out_of_range(name, number)
        if why:  # NaN, inf, 0 or a negative window or penalty stopped the run with a traceback
            print(f"history_rates.py: --set {setting}: {why}", file=sys.stderr)
            return 2
        setattr(changepoints, name, type(getattr(changepoints, name))(number))
    chosen = [i for i, s in enumerate(SCENARIOS) if args.select in s.name]
    if not chosen:
        print(f"history_rates.py: no scenario holds {args.select!r}", file=sys.stderr)
        return 2
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.perf_counter()
    if args.jobs == 1:
        rows = [measure(i, seeds) for i in chosen]
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = [measure(i, seeds, pool, args.jobs) for i in chosen]
    print(
        tabulate(
            rows,
            headers=[
                "series",
                "history: series with a change found",
                "a certain finding's range holds the change",
                "place uncertain (its range, its hunt holds the change)",
                "asv: series with a step (at the commit)",
            ],
            tablefmt="github",
        )
    )
    took = time.perf_counter() - started
    print(
        f"{len(rows) * args.seeds} series in {took:.0f} s ({args.jobs} process(es)); history's own CPU time: "
        f"{CPU['µs'] / CPU['series'] / 1000:.1f} ms a series",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
