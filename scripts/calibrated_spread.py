"""Does the calibrated step cost (a step's time over the calibration kernel's time beside it) hold across load
better than raw tokens/s? Runs one CPU case N times on the machine as it is, then N times beside two busy loops,
and prints the spread of each figure (coefficient of variation within each condition and over all runs, and the
shift of the mean under load).

    python scripts/calibrated_spread.py --runs 5 [--model cpu-small --recipe ckpt-fp32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gptcore.cli.arguments import positive  # noqa: E402
from gptcore.gate.results import unwritable  # noqa: E402
from gptcore.measure.runner import run_case  # noqa: E402
from gptcore.presets import get_model, get_recipe  # noqa: E402
from gptcore.training.trainer import UnsupportedRecipe, check_runnable  # noqa: E402

BUSY = "while True: pass"


def runs(model: str, recipe: str, n: int) -> list[tuple[float, float]]:
    """(tokens/s, calibrated step cost) of ``n`` runs of the case: 3 warm-up steps, 11 rounds of 4 (the
    documented measurement; longer rounds than the CPU tier's own)."""
    out = []
    for _ in range(n):
        m = run_case(get_model(model), get_recipe(recipe), "cpu", warmup=3, rounds=11, steps_per_round=4, loss_step=15)
        out.append((m.tokens_per_s, m.calibrated_cost))
    return out


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive, default=5, help="runs per load (two at least: a spread)")
    parser.add_argument("--model", default="cpu-small")
    parser.add_argument("--recipe", default="ckpt-fp32")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs: a spread needs 2 runs at least, got {args.runs}")
    try:  # a CPU study: a recipe the CPU cannot run (tf32, ddp) is refused here, not in the first run
        check_runnable(get_recipe(args.recipe), "cpu", get_model(args.model))
    except (ValueError, UnsupportedRecipe) as err:
        parser.exit(2, f"calibrated_spread.py: {err}\n")
    why = unwritable(args.json) if args.json else None
    if why:
        parser.exit(2, f"calibrated_spread.py: --json {args.json}: {why}\n")
    idle = runs(args.model, args.recipe, args.runs)
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        loaded = runs(args.model, args.recipe, args.runs)
    finally:
        for p in loops:
            p.kill()
    rows = []
    for i, name in enumerate(("tokens/s", "calibrated step cost")):
        a, b = [r[i] for r in idle], [r[i] for r in loaded]
        shift = statistics.mean(b) / statistics.mean(a) - 1
        rows.append(
            [
                name,
                f"{statistics.mean(a):.4g}",
                f"{cv(a):.1%}",
                f"{statistics.mean(b):.4g}",
                f"{cv(b):.1%}",
                f"{shift:+.1%}",
                f"{cv(a + b):.1%}",
            ]
        )
    from tabulate import tabulate

    print(
        tabulate(
            rows,
            headers=[
                "figure",
                "idle mean",
                "idle CV",
                "loaded mean",
                "loaded CV",
                "shift under load",
                "CV of all runs",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    if args.json:
        args.json.write_text(json.dumps({"idle": idle, "loaded": loaded}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
