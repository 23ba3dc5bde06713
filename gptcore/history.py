"""Change points over commits: the creeping regression that no single run fails, caught in pytest-benchmark's saved
runs (``.benchmarks/<device>/<machine>/NNNN_*.json``, each with its commit), named by its commit range, and handed
to ``bisect``.

Per case and metric the saved runs make a series in commit order (several runs of one commit are repeated points):
- exact metrics (CPU tracked memory, the CPU loss at its step, every work-ledger count) need no statistics: any
  change between two commits is a step, at the commit where it happened;
- noisy metrics (GPU tokens/s and memory, the GPU loss, a convergence run's final validation loss) are cut by
  ruptures' PELT (a penalised least-squares search for mean shifts) on the series scaled by its point-to-point noise;
  a cut counts when its step is at least :data:`MIN_STEP` and a Welch t-test between the segments gives p <
  :data:`P_MAX`. CPU tokens/s is left out: on CPU speed gates nothing.
- a status by PyTorch HUD's rule: with at least 2 points after the step it is a regression (worse) or an
  improvement, with fewer it is suspicious;
- a creeping change: a sustained slope over :data:`WINDOW` commits that adds up past the metric's tolerance
  (a least-squares line through the per-commit means, p < 0.01).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIN_STEP = 0.01
"""A noisy metric's smallest step that counts (Chromium's dashboard: 1%)."""
P_MAX = 1e-3
"""A noisy step counts when the two segments differ at this significance (Welch's t-test)."""
PENALTY = 4.0
"""PELT's penalty per change point, times log(n), on the series in units of its noise (false change points
measured at most 1 in 100 step-free series of 50 points at CV 0.6% and 2.7%: tests/test_history.py)."""
AMBIGUOUS = 1.0
"""A point within this many noise sigmas of the midpoint between two segments could belong to either: the commit
range of a step is widened over such points next to the cut, so that it holds the commit that made the step."""
MIN_SIZE = 3
"""The fewest points a segment of a noisy series may have."""
WINDOW = 6
"""Commits a creeping change is looked for over."""
CREEP = {"tokens/s": 0.05, "peak memory": 0.02, "val loss": 0.025}
"""The total a creep must add up to over WINDOW commits: the gate's own tolerances (relative; val loss: nats)."""
WORSE = {"tokens/s": "lower"}
"""The direction that is worse, where it is not higher."""
BISECT = {"tokens/s": "tokens_per_s", "peak memory": "peak_memory", "loss": "loss"}


@dataclass
class Point:
    commit: str
    time: str
    value: float


@dataclass
class Finding:
    """A change point (or a creeping window) of one case's metric."""

    case: str
    metric: str
    kind: str
    """'step' or 'creep'."""
    before: str
    """The last commit before the change."""
    after: str
    """The first commit after it."""
    change: float
    """after - before (a step's mean shift; a creep's total over its window)."""
    relative: float | None
    p: float | None
    """Significance (None: exact metric)."""
    points_after: int
    status: str
    """regression, improvement, changed (either direction is news), suspicious, or creeping."""
    note: str = ""

    def size(self) -> str:
        """The change as text: '+8,915,712 (+43.2%)', '-0.111657 (-3.0%)'."""
        number = f"{self.change:+,.0f}" if abs(self.change) >= 1000 else f"{self.change:+.6g}"
        return number + (f" ({self.relative:+.1%})" if self.relative is not None else "")

    def line(self) -> str:
        size = self.size()
        where = f"between {self.before[:12]} and {self.after[:12]}"
        how = "exact" if self.p is None else f"p {self.p:.1e}"
        return f"{self.case} {self.metric}: {size} {where} ({how}; {self.note}): {self.status}"

    def command(self) -> str | None:
        """What hunts the commit: bisect for its metrics, compare (which names operators) for work counts."""
        if self.status not in ("regression", "creeping"):
            return None
        case_id = self.case.split("[", 1)[-1].rstrip("]")
        if self.metric in BISECT:
            return (f"python -m gptcore bisect {self.before[:12]} {self.after[:12]} -k {case_id} "
                    f"--metric {BISECT[self.metric]}")
        return f"python -m gptcore compare {self.before[:12]} {self.after[:12]} -k {case_id}"


@dataclass
class History:
    """Every series read and what was found in it, with one line per thing left out."""

    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    series: int = 0
    runs: int = 0

    def to_json(self) -> dict:
        return {"runs": self.runs, "series": self.series, "findings": [asdict(f) for f in self.findings],
                "skipped": self.skipped}


# -- reading -------------------------------------------------------------------------------------------------------


def _metrics(info: dict) -> dict[str, tuple[float, bool]]:
    """A saved case's metrics: name -> (value, exact)."""
    cpu = str(info.get("device") or "cpu").startswith("cpu")
    out: dict[str, tuple[float, bool]] = {}
    convergence = info.get("convergence")
    if isinstance(convergence, dict) and convergence.get("val_loss"):
        return {"val loss": (float(convergence["val_loss"][-1]), False)}
    if not cpu and isinstance(info.get("tokens_per_s"), (int, float)):
        out["tokens/s"] = (float(info["tokens_per_s"]), False)
    if isinstance(info.get("peak_allocated_bytes"), (int, float)):
        out["peak memory"] = (float(info["peak_allocated_bytes"]), cpu)
    if isinstance(info.get("loss"), (int, float)):
        out[f"loss@{info.get('loss_step')}"] = (float(info["loss"]), cpu)
    work = info.get("work")
    if isinstance(work, dict):
        for name, key in (("flops", "flops"), ("op calls", "op_calls")):
            if isinstance(work.get(key), dict):
                out[name] = (float(sum(work[key].values())), True)
        for name in ("syncs", "allocations", "allocated_bytes"):
            if isinstance(work.get(name), (int, float)):
                out[name.replace("_", " ")] = (float(work[name]), True)
        for name, value in (work.get("compile") or {}).items():
            out[name.replace("_", " ")] = (float(value), True)
    return out


def read(storage: str | Path, select: str | None = None) -> tuple[dict[tuple[str, str], list[Point]], dict, History]:
    """The series of every (case, metric) in the saved runs under ``storage``, in commit order; which metrics are
    exact; and a History holding one line per run or case left out. ValueError for a folder that is missing or
    holds no saved run."""
    storage = Path(str(storage).removeprefix("file://"))
    if not storage.is_dir():
        raise ValueError(f"{storage}: no such directory (pytest-benchmark's storage, e.g. .benchmarks/cpu)")
    pattern = "[0-9][0-9][0-9][0-9]_*.json"
    paths = sorted(storage.glob(pattern)) + sorted(storage.glob(f"*/{pattern}"))
    if not paths:
        raise ValueError(f"{storage}: no saved pytest-benchmark run (save some with --benchmark-autosave)")
    history, loaded = History(), []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            history.skipped.append(f"{path.name}: not a readable run ({type(err).__name__})")
            continue
        commit = (data.get("commit_info") or {}).get("id")
        if not commit:
            history.skipped.append(f"{path.name}: no commit recorded (left out)")
            continue
        slug = (data.get("machine_info") or {}).get("device_slug", "?")
        time = str((data.get("commit_info") or {}).get("time") or data.get("datetime") or "")
        loaded.append((time, str(data.get("datetime") or ""), path.name, commit, slug, data))
    slugs = [run[4] for run in loaded]
    device = max(set(slugs), key=slugs.count) if slugs else None
    series: dict[tuple[str, str], list[Point]] = {}
    exact: dict[tuple[str, str], bool] = {}
    for time, _, name, commit, slug, data in sorted(loaded):
        if slug != device:
            history.skipped.append(f"{name}: device {slug}, not {device} like the rest (left out)")
            continue
        history.runs += 1
        for bench in data.get("benchmarks") or []:
            case = str(bench.get("name", ""))
            if select and select not in case:
                continue
            for metric, (value, is_exact) in _metrics(bench.get("extra_info") or {}).items():
                series.setdefault((case, metric), []).append(Point(commit, time, value))
                exact[(case, metric)] = is_exact
    return series, exact, history


# -- finding -------------------------------------------------------------------------------------------------------


def _status(metric: str, change: float, points_after: int) -> str:
    if points_after < 2:
        return "suspicious"
    if metric.startswith("loss@"):
        return "changed"
    worse = WORSE.get(metric, "higher")
    return "regression" if (change > 0) == (worse == "higher") else "improvement"


def exact_steps(case: str, metric: str, points: list[Point]) -> list[Finding]:
    """Every commit at which an exact metric changed."""
    found = []
    for i in range(1, len(points)):
        a, b = points[i - 1], points[i]
        if b.value == a.value or a.commit == b.commit:
            continue
        j = i
        while j < len(points) and points[j].value == b.value:
            j += 1
        change = b.value - a.value
        found.append(Finding(case, metric, "step", a.commit, b.commit, change,
                             change / a.value if a.value else None, None, j - i,
                             _status(metric, change, j - i), f"{j - i} point(s) after"))
    return found


def noise(values: list[float]) -> float:
    """The series' point-to-point noise (standard deviation), robust to steps: the median absolute first
    difference / (0.6745 x sqrt 2)."""
    diffs = [abs(b - a) for a, b in zip(values, values[1:])]
    return statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs else 0.0


def noisy_steps(case: str, metric: str, points: list[Point]) -> list[Finding]:
    """The mean shifts of a noisy series (ruptures' PELT on the series in units of its noise)."""
    import numpy as np
    import ruptures
    from scipy import stats

    values = [p.value for p in points]
    sigma = noise(values) or 1e-12 * (abs(statistics.mean(values)) or 1.0)
    z = (np.asarray(values) - statistics.median(values)) / sigma
    cuts = ruptures.Pelt(model="l2", min_size=MIN_SIZE, jump=1).fit(z.reshape(-1, 1)).predict(
        pen=PENALTY * math.log(len(values)))
    bounds, found = [0, *cuts], []
    for k in range(1, len(bounds) - 1):
        start, cut, end = bounds[k - 1], bounds[k], bounds[k + 1]
        while 0 < cut < len(points) and points[cut - 1].commit == points[cut].commit:  # cut between commits
            cut -= 1
        if not start < cut < end:
            continue
        before, after = values[start:cut], values[cut:end]
        mean_before, mean_after = statistics.mean(before), statistics.mean(after)
        relative = mean_after / mean_before - 1 if mean_before else None
        p = float(stats.ttest_ind(after, before, equal_var=False).pvalue) if min(len(before), len(after)) > 1 else 1.0
        if relative is None or abs(relative) < MIN_STEP or not p < P_MAX:
            continue
        change = mean_after - mean_before
        lo, hi = _ambiguous(values, start, cut, end, (mean_before + mean_after) / 2, sigma)
        found.append(Finding(case, metric, "step", points[lo - 1].commit, points[hi].commit, change, relative, p,
                             end - cut, _status(metric, change, end - cut), f"{end - cut} point(s) after"))
    return found


def _ambiguous(values: list[float], start: int, cut: int, end: int, middle: float, sigma: float) -> tuple[int, int]:
    """The commit range a noisy step may lie in: the cut widened over the points next to it that are within
    AMBIGUOUS noise of the midpoint between the segments (either side could own them). Returns (lo, hi): the step
    is after point lo - 1 and at or before point hi."""
    lo, hi = cut, cut
    while lo - 1 > start and abs(values[lo - 1] - middle) < AMBIGUOUS * sigma:
        lo -= 1
    while hi + 1 < end and abs(values[hi] - middle) < AMBIGUOUS * sigma:
        hi += 1
    return lo, hi


def creeping(case: str, metric: str, points: list[Point]) -> list[Finding]:
    """Windows of WINDOW commits over which the per-commit means slope past the metric's tolerance in the worse
    direction (p < 0.01); of overlapping such windows, the steepest."""
    from scipy import stats

    tolerance = CREEP.get(metric)
    commits: dict[str, list[float]] = {}
    for p in points:
        commits.setdefault(p.commit, []).append(p.value)
    names, means = list(commits), [statistics.mean(v) for v in commits.values()]

    def fit(i: int) -> tuple[float, float, float] | None:
        """(per-commit change, total over the window, p) when window i qualifies."""
        window = means[i:i + WINDOW]
        line = stats.linregress(range(WINDOW), window)
        per_commit = line.slope / statistics.mean(window) if metric != "val loss" else line.slope
        total = per_commit * WINDOW
        worse = (total < 0) if WORSE.get(metric) == "lower" else (total > 0)
        return (per_commit, total, float(line.pvalue)) if abs(total) >= tolerance and line.pvalue < 0.01 and worse \
            else None

    found, i = [], 0
    while tolerance is not None and i + WINDOW <= len(means):
        if fit(i) is None:
            i += 1
            continue
        best = max((j for j in range(i, min(i + WINDOW, len(means) - WINDOW + 1)) if fit(j)),
                   key=lambda j: abs(fit(j)[1]))
        per_commit, total, p = fit(best)
        unit = f"{per_commit:+.1%}" if metric != "val loss" else f"{per_commit:+.4f} nats"
        found.append(Finding(case, metric, "creep", names[best], names[best + WINDOW - 1], total,
                             total if metric != "val loss" else None, p, 0, "creeping",
                             f"{unit} per commit over {WINDOW} commits"))
        i = best + WINDOW
    return found


def analyse(storage: str | Path, select: str | None = None) -> History:
    """Every change point and creeping window in the saved runs under ``storage`` (``select``: a substring of the
    case names)."""
    series, exact, history = read(storage, select)
    for (case, metric), points in sorted(series.items()):
        history.series += 1
        if exact[(case, metric)]:
            history.findings += exact_steps(case, metric, points)
            continue
        if len(points) < 2 * MIN_SIZE:
            history.skipped.append(f"{case} {metric}: {len(points)} point(s), fewer than the {2 * MIN_SIZE} the "
                                   f"change-point search needs")
            continue
        history.findings += noisy_steps(case, metric, points) + creeping(case, metric, points)
    return history


def section(storage: str | Path) -> str:
    """The markdown section for the saved runs under ``storage`` (the gate's --gate-history); a line saying why
    not where they cannot be read."""
    try:
        return markdown(analyse(storage))
    except ValueError as err:
        return f"### Change points in history\n\nNot analysed: {err}\n"


def markdown(history: History) -> str:
    """The "Change points in history" section of the markdown verdict."""
    out = ["### Change points in history", ""]
    if not history.findings:
        return "\n".join(out + [f"None in {history.series} series over {history.runs} saved run(s).", ""])
    out += ["| case | metric | change | commits | significance | status |", "|---|---|---|---|---|---|"]
    for f in history.findings:
        size = f.size()
        out.append(f"| {f.case.replace('[', chr(92) + '[').replace(']', chr(92) + ']')} | {f.metric} | {size} | "
                   f"{f.before[:7]}..{f.after[:7]} | {'exact' if f.p is None else f'p {f.p:.1e}'} | "
                   f"{f.status} ({f.note}) |")
    return "\n".join(out + [""])
