"""Regression hunting on one machine: ``compare`` two git revisions, or one revision under two Python
interpreters (two virtual environments: another torch, CUDA or driver stack), case by case, interleaved in fresh
processes (``gptcore.hunt.bisection`` builds ``bisect`` on it).

Each round runs one process per revision (A B, then B A, and so on): the driver (``gptcore/hunt/driver.py``, run
as a script with the revision's checkout on PYTHONPATH) builds the revision's own Trainer, warms up, times K steps
and prints one JSON line. It uses only what every revision with a benchmark tier has (``gptcore.config``,
``gptcore.training.trainer.Trainer``, ``gptcore.measure.runner.StepTimer`` and ``cpu_peak_bytes``; the work ledger
where there is one).

Speed is judged on tokens/s per round: the ratio of the medians B/A, and a Hodges-Lehmann interval of the ratio
with its Mann-Whitney test (exact for small samples, on log tokens/s). A case is slower or faster only when the
ratio is beyond the threshold AND the interval excludes 1. Peak memory and the loss are compared as the gate does,
and the work ledger of one step (FLOPs and operator calls per phase, syncs, allocations), where the revision has
one, exactly: every count that moved is listed. No torch is imported when this module loads.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gptcore.config import setup_differences
from gptcore.gate.checks import Check, loss_check, memory_check
from gptcore.gate.schema import Tolerances
from gptcore.gate.verdicts import busy_check, moved_kinds
from gptcore.hunt.driver import MARK
from gptcore.hunt.ledger import ledger_changes
from gptcore.hunt.revisions import commit_of, repo_root, snapshot, worktree
from gptcore.hunt.significance import SLOWER, Speed, speed_verdict
from gptcore.identity import local_device
from gptcore.presets import RECIPES, STUDIES


class CompareError(ValueError):
    """Bad input (not a git repository, an unknown revision, no case selected): one line, exit code 2."""


# -- selecting cases -----------------------------------------------------------------------------------------------


def keyword_match(expr: str, name: str) -> bool:
    """pytest's -k on one case id, with pytest's own expression parser (substrings joined by ``and``, ``or``,
    ``not`` and parentheses)."""
    from _pytest.mark.expression import Expression

    try:
        return Expression.compile(expr).evaluate(lambda word, **_: word in name)
    except SyntaxError as err:  # pytest reports a malformed expression as a SyntaxError
        raise CompareError(f"-k {expr!r}: {err.msg}") from None


def all_cases(device_type: str) -> list[tuple[str, str]]:
    """(model, recipe) of every case of the studies that run on ``device_type`` ('cpu' or 'cuda'), no repeats."""
    cases: dict[str, tuple[str, str]] = {}
    for study in STUDIES.values():
        if study.device == device_type:
            for model in study.models:
                for recipe in study.recipes:
                    cases.setdefault(f"{model}-{recipe}", (model, recipe))
    return list(cases.values())


def select_cases(expr: str, device_type: str) -> list[tuple[str, str]]:
    """The cases whose id ``{model}-{recipe}`` matches ``expr``; CompareError when none does."""
    chosen = [case for case in all_cases(device_type) if keyword_match(expr, f"{case[0]}-{case[1]}")]
    if not chosen:
        raise CompareError(
            f"-k {expr!r}: no {device_type.upper()} case matches (ids are like {'-'.join(all_cases(device_type)[0])})"
        )
    return chosen


# -- the driver ----------------------------------------------------------------------------------------------------

DRIVER = Path(__file__).with_name("driver.py")
"""The driver each round runs in a fresh process (copied out, then run with one revision's checkout first on
PYTHONPATH, so that it imports that revision's gptcore)."""


class DriverError(RuntimeError):
    """A driver process failed: the revision could not run the case."""


@dataclass
class Options:
    """How each round measures: warm-up steps, timed steps, device; ``memory``: measure peak memory (on CPU a
    tracked pass of its own, so only in the first round: the figure is exact)."""

    warmup: int = 3
    steps: int = 10
    device: str = "cpu"
    timeout: float = 900.0


def run_driver(
    tree: Path, model: str, recipe: str, options: Options, script: Path, memory: bool, python: str = sys.executable
) -> dict:
    """One fresh process of the interpreter ``python`` measuring ``model``/``recipe`` with the code of the
    checkout ``tree``."""
    spec = dict(
        root=str(tree),
        model=model,
        recipe=recipe,
        warmup=options.warmup,
        steps=options.steps,
        device=options.device,
        memory=memory,
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        out = subprocess.run(
            [python, str(script), json.dumps(spec)],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=options.timeout,
        )
    except subprocess.TimeoutExpired:
        raise DriverError(f"{model}-{recipe}: no answer in {options.timeout:.0f} s") from None
    lines = [line for line in out.stdout.splitlines() if line.startswith(MARK)]
    if out.returncode or not lines:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise DriverError(f"{model}-{recipe}: {last}")
    return json.loads(lines[-1][len(MARK) :])


def write_driver(directory: Path) -> Path:
    """A copy of the driver in ``directory`` (outside any checkout, so that every revision runs the same one)."""
    path = directory / "gptcore_compare_driver.py"
    path.write_text(DRIVER.read_text())
    return path


# -- compare -------------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """Every figure of one case: the per-round records of A and B and the verdicts."""

    case: str
    model: str
    recipe: str
    precision: str
    rounds_a: list[dict] = field(default_factory=list)
    rounds_b: list[dict] = field(default_factory=list)
    speed: Speed | None = None
    memory: Check | None = None
    """B's peak memory against A's, as the gate judges it ('changed' where it moved within tolerance)."""
    loss: Check | None = None
    busy: Check | None = None
    """On a GPU, B's busy time of one traced step against A's, as the gate judges it, with the kinds of kernel that
    moved it; None where neither side traced one (a CPU, revisions from before it)."""
    work: list[str] | None = None
    """Each work-ledger count that moved, 'op_calls.backward 250 -> 262 (+12)', and each operator swapped
    (gptcore.hunt.ledger); [] when none did; None when a side has no ledger."""
    error: str | None = None
    setup: list[str] | None = None
    """Each field in which B's setup (the case's model and recipe) differs from A's, 'recipe.lr 0.001 -> 0.002': B
    then measures another experiment, and the changes say why; None where a side keeps no setup (a revision from
    before setups were kept)."""

    @property
    def failed(self) -> bool:
        return bool(
            self.error
            or (self.speed and self.speed.verdict == SLOWER)
            or (self.memory and self.memory.failed)
            or (self.loss and self.loss.failed)
            or (self.busy and self.busy.failed)
        )

    def tokens(self, which: str) -> list[float]:
        return [r["tokens_per_s"] for r in (self.rounds_a if which == "a" else self.rounds_b)]

    def to_json(self) -> dict:
        data = asdict(self)
        data.update(tokens_per_s_a=self.tokens("a"), tokens_per_s_b=self.tokens("b"), failed=self.failed)
        return data


def _first(rounds: list[dict], key: str) -> Any:
    """The first round's ``key`` that is not None (a figure, the torch, the work ledger, the setup); None if none."""
    return next((r[key] for r in rounds if r.get(key) is not None), None)


def decide(result: CaseResult, threshold: float, tol: Tolerances) -> CaseResult:
    """Fill in the speed, memory and loss verdicts from the rounds (B measured against A as its reference)."""
    a, b = result.tokens("a"), result.tokens("b")
    broken = [side for side, xs in (("A", a), ("B", b)) if any(not math.isfinite(x) for x in xs)]
    if broken:  # no statistics over NaN or inf: the case fails, naming the side whose timing broke
        result.error = result.error or f"tokens/s not finite in {' and '.join(broken)}'s rounds (the timing broke)"
    elif a and b:
        result.speed = speed_verdict(a, b, threshold)
    result.memory = memory_check(
        _first(result.rounds_b, "peak_memory"), _first(result.rounds_a, "peak_memory"), tol, report_change=True
    )
    result.loss = loss_check(
        _first(result.rounds_b, "loss"),
        _first(result.rounds_a, "loss"),
        tol.loss_tolerance(result.precision, other_cpu=False),
        step=_first(result.rounds_b, "loss_step"),
        before_step=_first(result.rounds_a, "loss_step"),
    )
    kinds = moved_kinds(_first(result.rounds_b, "gpu_kernel_seconds"), _first(result.rounds_a, "gpu_kernel_seconds"))
    busy = _first(result.rounds_b, "gpu_busy_seconds"), _first(result.rounds_a, "gpu_busy_seconds")
    result.busy = busy_check(*busy, tol, where=kinds)
    setups = _first(result.rounds_a, "setup"), _first(result.rounds_b, "setup")
    result.setup = setup_differences(*setups) if all(setups) else None
    result.work = ledger_changes(
        _first(result.rounds_a, "work"),
        _first(result.rounds_b, "work"),
        torches=(_first(result.rounds_a, "torch"), _first(result.rounds_b, "torch")),
    )
    return result


Progress = Callable[[CaseResult, int, int], None]


def compare_trees(
    tree_a: Path,
    tree_b: Path,
    cases: Sequence[tuple[str, str]],
    *,
    rounds: int,
    threshold: float,
    options: Options,
    workdir: Path,
    progress: Progress | None = None,
    python_a: str = sys.executable,
    python_b: str = sys.executable,
) -> list[CaseResult]:
    """Each case: ``rounds`` rounds of A then B, each in a fresh process of its interpreter; the verdicts."""
    script = write_driver(workdir)
    tol = Tolerances.default_for(options.device)
    results = []
    for model, recipe in cases:
        result = CaseResult(f"{model}-{recipe}", model, recipe, RECIPES[recipe].precision)
        try:
            for i in range(rounds):
                memory = options.device == "cuda" or i == 0
                # A B, B A, A B, ...: neither revision always runs second (a drift or another job that started
                # at a steady beat would otherwise land on one of them: measured, an A/A comparison said
                # "slower" at 0.13x)
                order = ((tree_a, python_a, result.rounds_a), (tree_b, python_b, result.rounds_b))
                for tree, python, records in order if i % 2 == 0 else order[::-1]:
                    records.append(run_driver(tree, model, recipe, options, script, memory, python))
                if progress:
                    progress(result, i + 1, rounds)
        except DriverError as err:
            result.error = str(err)
        results.append(decide(result, threshold, tol))
    return results


@dataclass
class Revision:
    label: str
    sha: str | None
    """None: the working tree as it is."""
    python: str = sys.executable
    """The interpreter that runs it (its virtual environment's torch)."""
    torch: str | None = None
    """The torch version that interpreter imports (filled in by ``compare``)."""


@contextlib.contextmanager
def checkout(repo: Path, rev: Revision, parent: Path) -> Iterator[Path]:
    """A worktree of the revision, or a snapshot of the working tree."""
    if rev.sha is None:
        yield snapshot(repo, parent)
    else:
        with worktree(repo, rev.sha, parent) as path:
            yield path


def revisions(repo: Path, base: str, head: str | None) -> tuple[Revision, Revision]:
    """BASE and HEAD resolved (HEAD None: the working tree, uncommitted changes included)."""
    a = Revision(base, commit_of(repo, base))
    b = Revision("working tree", None) if head is None else Revision(head, commit_of(repo, head))
    return a, b


def interpreter(python: str | None) -> tuple[str, str]:
    """The interpreter's path and the torch version it imports; CompareError (one line) when it cannot run or has
    no torch."""
    path = shutil.which(python) if python else sys.executable
    if not path:
        raise CompareError(f"python {python!r}: no such interpreter")
    try:
        out = subprocess.run(
            [path, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CompareError(f"python {path}: cannot run it: {err}") from None
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["failed"])[-1]
        raise CompareError(f"python {path}: cannot import torch: {last}")
    version = (out.stdout.strip().splitlines() or [""])[-1]
    if not re.fullmatch(r"\d+\.\d+\S*", version):  # /usr/bin/true exits 0 too
        raise CompareError(f"python {path}: not a Python that imports torch (torch.__version__ printed {version!r})")
    return path, version


def compare(
    base: str | None,
    head: str | None,
    expr: str,
    *,
    rounds: int = 10,
    threshold: float = 0.05,
    options: Options | None = None,
    cwd: str | Path | None = None,
    progress: Progress | None = None,
    python_a: str | None = None,
    python_b: str | None = None,
) -> tuple[Revision, Revision, list[CaseResult]]:
    """Compare revision ``head`` (None: the working tree) with ``base`` on the cases ``expr`` selects, A under
    ``python_a`` and B under ``python_b`` (default: this interpreter). ``base`` None: both sides are the working
    tree, told apart by their interpreters (an upgrade of torch, CUDA or a driver)."""
    if rounds < 1 or not 0 <= threshold < 1:
        raise CompareError(f"need rounds >= 1 and 0 <= threshold < 1, got {rounds}, {threshold}")
    if base is None and not (python_a or python_b):
        raise CompareError("give BASE (a revision), or --python-a/--python-b to compare two interpreters")
    repo = repo_root(cwd)
    a, b = (
        revisions(repo, base, head)
        if base is not None
        else (Revision("working tree", None), Revision("working tree", None))
    )
    a.python, a.torch = interpreter(python_a)
    b.python, b.torch = (a.python, a.torch) if python_b == python_a else interpreter(python_b)
    options = options or Options(device=local_device())
    cases = select_cases(expr, options.device)
    with tempfile.TemporaryDirectory(prefix="gptcore-compare-") as tmp:
        with checkout(repo, a, Path(tmp)) as tree_a:
            same = base is None  # one snapshot serves both interpreters: the same code on each side
            with contextlib.nullcontext(tree_a) if same else checkout(repo, b, Path(tmp)) as tree_b:
                results = compare_trees(
                    tree_a,
                    tree_b,
                    cases,
                    rounds=rounds,
                    threshold=threshold,
                    options=options,
                    workdir=Path(tmp),
                    progress=progress,
                    python_a=a.python,
                    python_b=b.python,
                )
    return a, b, results


def to_json(a: Revision, b: Revision, results: Sequence[CaseResult], **settings: object) -> dict:
    return {
        "a": asdict(a),
        "b": asdict(b),
        "settings": settings,
        "cases": [r.to_json() for r in results],
        "failed": any(r.failed for r in results),
    }
