"""The rates behind docs/history.md, measured with the tests' own generator (tests/test_history.py ``series``):
how often ``gptcore.hunt.history`` finds a step or a creep, how often its commit range holds the commit that made the
change, how often it reports a change where there is none, and asv's step detector (``asv.step_detect.detect_steps``,
if installed: ``pip install asv``) on the same series, side by side.

    python scripts/history_rates.py [--seeds 1000] [--first-seed 1000]

Each row is one scenario over ``--seeds`` seeded series (seeds first-seed, first-seed + 1, ...). Prints a markdown
table; about a minute for 1,000 seeds on one core.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    from tabulate import tabulate

    from gptcore.hunt import history
    from tests.test_history import series
except ModuleNotFoundError as err:  # one line, never a traceback
    sys.exit(f"history_rates.py: {sys.executable} lacks {err.name}: pip install -e '.[dev]' first")


@dataclass(frozen=True)
class Scenario:
    name: str
    make: Callable[[int], list]
    """seed -> the series (tests.test_history.Point list)."""
    change_at: int | None
    """The commit that made the change (None: step-free)."""
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
    ),
    Scenario("step-free, 50 points, CV 0.6%, tokens/s", lambda s: series(50, 0.006, seed=s), None),
    Scenario("step-free, 50 points, CV 2.7%, tokens/s", lambda s: series(50, 0.027, seed=s), None),
    Scenario(
        "step-free, 50 points, CV 2.7%, peak memory",
        lambda s: series(50, 0.027, seed=s),
        None,
        metric="peak memory",
        tolerance=0.02,
    ),
]


def holds(finding: history.Finding, commit: int) -> bool:
    """The finding's range (last commit before, first after] holds ``commit``."""
    return int(finding.before[1:]) < commit <= int(finding.after[1:])


def asv_steps(points: list) -> list[int] | None:
    """The indices where asv's detect_steps starts a new segment (None without asv)."""
    try:
        from asv.step_detect import detect_steps
    except ModuleNotFoundError:
        return None
    steps = detect_steps([p.value for p in points])
    return [left for left, *_ in steps[1:]]


def hunted(finding: history.Finding, commit: int) -> bool:
    """The range the finding's hunt covers (its own, or the wider one of an uncertain place) holds ``commit``."""
    before, after = finding.hunt or (finding.before, finding.after)
    return int(before[1:]) < commit <= int(after[1:])


def measure(scenario: Scenario, seeds: range) -> list[str]:
    found = creeps = 0
    certain = certain_held = uncertain = uncertain_hunted = 0
    asv_found = asv_held = 0
    have_asv = True
    for seed in seeds:
        points = scenario.make(seed)
        findings = history.changes("c", scenario.metric, points, scenario.tolerance)
        found += bool(findings)
        creeps += any(f.kind == "creep" for f in findings)
        if scenario.change_at is not None:
            for f in findings:
                if f.kind == "creep":  # a stretch of commits: its own row below
                    continue
                if f.uncertain:
                    uncertain += 1
                    uncertain_hunted += hunted(f, scenario.change_at)
                else:
                    certain += 1
                    certain_held += holds(f, scenario.change_at)
        cuts = asv_steps(points)
        if cuts is None:
            have_asv = False
        elif cuts:
            asv_found += 1
            asv_held += scenario.change_at in cuts
    n = len(seeds)
    step = scenario.change_at is not None
    return [
        scenario.name,
        f"{found} / {n}" + (f" ({creeps} with a creep)" if creeps else ""),
        f"{certain_held} / {certain}" if step and certain else "—",
        f"{uncertain}, hunt holds it in {uncertain_hunted}" if step and uncertain else ("0" if step else "—"),
        (f"{asv_found} / {n}" + (f", at the commit in {asv_held}" if step else "")) if have_asv else "no asv",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--first-seed", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.seeds < 1:
        print("history_rates.py: --seeds must be at least 1", file=sys.stderr)
        return 2
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows = [measure(s, seeds) for s in SCENARIOS]
    print(
        tabulate(
            rows,
            headers=[
                "series",
                "history: series with a change found",
                "a certain step's range holds the commit",
                "place uncertain",
                "asv detect_steps: series with a step",
            ],
            tablefmt="github",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
