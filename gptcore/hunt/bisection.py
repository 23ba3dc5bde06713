"""``python -m gptcore bisect``: ``git bisect run`` in a temporary worktree (the user's checkout is not touched),
each step judging its commit against GOOD: compare's verdict for tokens/s (slower = bad), the gate's tolerance of
GOOD's exact figure for peak memory and the loss. No torch is imported when this module loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gptcore.gate.checks import Check, loss_check, memory_check
from gptcore.gate.schema import Tolerances
from gptcore.hunt.compare import (
    CompareError,
    DriverError,
    Options,
    compare_trees,
    run_driver,
    select_cases,
    write_driver,
)
from gptcore.hunt.revisions import commit_of, git, repo_root, subject, worktree
from gptcore.hunt.significance import SLOWER
from gptcore.identity import local_device
from gptcore.presets import RECIPES

METRICS = ("tokens_per_s", "peak_memory", "loss")
"""What ``bisect`` can hunt: a drop in tokens/s, or a rise in peak memory or a change of the loss."""


@dataclass
class BisectSpec:
    """What each step of ``git bisect run`` needs (written to a JSON file the step reads)."""

    good_tree: str
    cases: list[list[str]]
    metric: str
    rounds: int
    threshold: float
    options: dict
    good: dict
    """case id -> GOOD's worker record (peak_memory and loss metrics)."""
    log: str
    """File each step appends its figures to, one JSON line per commit."""


def _bad_by_exact(metric: str, good: dict, now: dict, precision: str, tol: Tolerances) -> Check:
    """This commit's peak memory or loss against GOOD's, as the gate judges them."""
    if metric == "peak_memory":
        return memory_check(now.get("peak_memory"), good.get("peak_memory"), tol, report_change=True)
    return loss_check(
        now.get("loss"),
        good.get("loss"),
        tol.loss_tolerance(precision, other_cpu=False),
        step=now.get("loss_step"),
        before_step=good.get("loss_step"),
    )


def judge_commit(tree: Path, spec: BisectSpec, workdir: Path) -> tuple[bool, dict]:
    """(bad, figures) of the checkout ``tree`` against GOOD; DriverError when it cannot run a case."""
    options = Options(**spec.options)
    tol = Tolerances.default_for(options.device)
    bad, figures = False, {}
    if spec.metric == "tokens_per_s":
        results = compare_trees(
            Path(spec.good_tree),
            tree,
            [tuple(c) for c in spec.cases],
            rounds=spec.rounds,
            threshold=spec.threshold,
            options=options,
            workdir=workdir,
        )
        for r in results:
            if r.error:
                raise DriverError(r.error)
            figures[r.case] = asdict(r.speed)
            bad = bad or r.speed.verdict == SLOWER
        return bad, figures
    script = write_driver(workdir)
    for model, recipe in spec.cases:
        case = f"{model}-{recipe}"
        now = run_driver(tree, model, recipe, options, script, memory=spec.metric == "peak_memory")
        check = _bad_by_exact(spec.metric, spec.good[case], now, RECIPES[recipe].precision, tol)
        figures[case] = asdict(check)
        bad = bad or check.failed
    return bad, figures


def bisect_step(spec_path: str) -> int:
    """One step of ``git bisect run`` (cwd: the commit under test): 0 good, 1 bad, 125 cannot test (skip)."""
    spec = BisectSpec(**json.loads(Path(spec_path).read_text()))
    tree = Path(os.getcwd())
    sha = git(tree, "rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix="gptcore-bisect-step-") as tmp:
        try:
            bad, figures = judge_commit(tree, spec, Path(tmp))
        except DriverError as err:
            bad, figures = None, {"error": str(err)}
    with open(spec.log, "a") as log:
        log.write(json.dumps({"sha": sha, "bad": bad, "figures": figures}) + "\n")
    print(f"gptcore bisect: {sha[:10]} {'skip' if bad is None else 'bad' if bad else 'good'}", file=sys.stderr)
    return 125 if bad is None else int(bad)


@dataclass
class BisectResult:
    good: str
    bad: str
    first_bad: str | None
    subject: str
    figures: dict
    """The first bad commit's figures against GOOD's, per case."""
    steps: list[dict]


def bisect(
    good: str,
    bad: str,
    expr: str,
    *,
    metric: str = "tokens_per_s",
    rounds: int = 10,
    threshold: float = 0.05,
    options: Options | None = None,
    cwd: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> BisectResult:
    """The first commit between ``good`` and ``bad`` that is worse than ``good`` on ``metric``, found by
    ``git bisect run`` in a temporary worktree (the user's checkout is not touched)."""
    if metric not in METRICS:
        raise CompareError(f"--metric: unknown {metric!r}; choose from {', '.join(METRICS)}")
    repo = repo_root(cwd)
    good_sha, bad_sha = commit_of(repo, good), commit_of(repo, bad)
    if good_sha == bad_sha:
        raise CompareError(f"GOOD {good!r} and BAD {bad!r} are the same commit ({good_sha[:12]}): nothing between them")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good_sha, bad_sha]).returncode:
        raise CompareError(f"GOOD {good!r} must be an ancestor of BAD {bad!r}")
    options = options or Options(device=local_device())
    cases = select_cases(expr, options.device)
    say = progress or (lambda _: None)
    with tempfile.TemporaryDirectory(prefix="gptcore-bisect-") as tmp:
        tmp_path = Path(tmp)
        with worktree(repo, good_sha, tmp_path) as good_tree, worktree(repo, bad_sha, tmp_path) as bad_tree:
            script = write_driver(tmp_path)
            good_figures = {}
            if metric != "tokens_per_s":
                say(f"measuring GOOD {good_sha[:10]}")
                for model, recipe in cases:
                    try:
                        good_figures[f"{model}-{recipe}"] = run_driver(
                            good_tree, model, recipe, options, script, memory=metric == "peak_memory"
                        )
                    except DriverError as err:
                        raise CompareError(f"GOOD {good!r} cannot run {err}") from None
            spec = BisectSpec(
                str(good_tree),
                [list(c) for c in cases],
                metric,
                rounds,
                threshold,
                asdict(options),
                good_figures,
                str(tmp_path / "steps.jsonl"),
            )
            spec_path = tmp_path / "spec.json"
            spec_path.write_text(json.dumps(asdict(spec)))
            say(f"checking that BAD {bad_sha[:10]} is worse than GOOD on {metric}")
            try:
                is_bad, bad_figures = judge_commit(bad_tree, spec, tmp_path)
            except DriverError as err:
                raise CompareError(f"BAD {bad!r} cannot run {err}") from None
            if not is_bad:
                raise CompareError(f"BAD {bad!r} is not worse than GOOD {good!r} on {metric}: nothing to bisect")
            driver = tmp_path / "gptcore_bisect_step.py"
            here = Path(__file__).resolve().parents[1]
            driver.write_text(
                f"import sys\nsys.path.insert(0, {str(here)!r})\nfrom gptcore.hunt.bisection import "
                f"bisect_step\nsys.exit(bisect_step({str(spec_path)!r}))\n"
            )
            git(bad_tree, "bisect", "start", bad_sha, good_sha)
            say("git bisect run ...")
            run = subprocess.run(
                ["git", "-C", str(bad_tree), "bisect", "run", sys.executable, str(driver)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
            )
            found = re.search(r"^([0-9a-f]{40}) is the first bad commit", run.stdout, re.M)
            subprocess.run(["git", "-C", str(bad_tree), "bisect", "reset"], capture_output=True)
            steps = (
                [json.loads(line) for line in Path(spec.log).read_text().splitlines()]
                if Path(spec.log).exists()
                else []
            )
    if not found:
        last = ([line for line in (run.stdout + run.stderr).splitlines() if line.strip()] or ["no output"])[-1]
        return BisectResult(good_sha, bad_sha, None, f"git bisect found no single commit: {last}", {}, steps)
    first = found.group(1)
    # BAD itself is never visited by the bisection: its figures come from the check above
    figures = next((s["figures"] for s in steps if s["sha"] == first), bad_figures if first == bad_sha else {})
    return BisectResult(good_sha, bad_sha, first, subject(repo, first), figures, steps)
