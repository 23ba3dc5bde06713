"""Change points over commits: the creeping regression that no single run fails, caught in pytest-benchmark's saved
runs (``.benchmarks/<device>/<machine>/NNNN_*.json``, each with its commit), named by its commit range, and handed
to ``bisect``.

Per case and metric the saved runs make a series in commit order (by commit time; several runs of one commit are
repeated points):

- exact metrics (CPU tracked memory, the CPU loss at its step, every work-ledger count) need no statistics: any
  change between two commits is a step, at the commit where it happened;
- noisy metrics (GPU tokens/s and memory, the GPU loss, a convergence run's final validation loss) are cut by
  ruptures' PELT (a penalised least-squares search for mean shifts) on the series in units of its point-to-point
  noise; a cut counts when its step is at least :data:`MIN_STEP` and a Welch t-test between the segments gives
  p < :data:`P_MAX`. A step in the last one or two commits, too short for a segment, counts when it lies
  :data:`Z_TAIL` noise sigmas off the segment before it. tokens/s is analysed only where the gate gates it
  (``Tolerances.speed``): on CPU it is left out;
- a status by PyTorch HUD's rule: with at least 2 points after the step it is a regression (worse) or an
  improvement, with fewer it is suspicious;
- a creeping change: per-commit means that slope the worse way over :data:`WINDOW` commits or more, adding up past
  the gate's own tolerance (``Tolerances.default_for``), :data:`Z_CREEP` standard errors from flat. Where a step
  was found in the stretch, the better fit decides which it is: one step, or a line (the step is then part of the
  creep).
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

MIN_STEP = 0.01
"""A noisy metric's smallest step that counts (Chromium's dashboard: 1%). Below the gate's tolerances on purpose:
a step inside one run's noise is what history is for."""
PENALTY = 6.0
"""PELT's penalty per change point, times log(n), on the series in units of its noise."""
P_MAX = 1e-4
"""A noisy step counts when the two segments differ at this significance (Welch's t-test). With PENALTY, chosen on
2,000 seeded step-free series of 50 points each (docs/history.md): 1 false change point at a CV of 0.6% and 2 at
2.7% (0.05-0.1% of series), while a 3% step with 8 points after it at CV 0.6% is found in 2,000 of 2,000."""
MIN_SIZE = 3
"""The fewest points a segment of a noisy series may have (PELT's min_size)."""
Z_TAIL = 4.0
"""A step in the last 1 or 2 commits (too few points for a segment) counts when the tail lies this many noise
sigmas from the segment before it: two-sided 6e-5 a test, two tests a series."""
AMBIGUOUS = 1.0
"""A point within this many noise sigmas of the midpoint between two segments could belong to either: the commit
range of a step is widened over such points next to the cut, so that it holds the commit that made the step."""
WINDOW = 6
"""Commit-to-commit changes (WINDOW + 1 commits) a creeping slope is first looked for over."""
Z_CREEP = 5.0
CV_PLACE = 0.015
"""A noisy series whose point-to-point noise is more than this, relative to its level (a hosted runner's 2.7%), has
no certain place for any step: a step found there is found where noise made it look larger (measured: a 3% drop at
2.7% noise, found in 60 of 1,000 series, had its range miss the commit in half of them). Such findings say so too."""
Z_PLACE = 3.0
"""A noisy step smaller than this many noise sigmas (of one point) has an uncertain place: the points beside it
could belong to either side, and its commit range misses the commit that made it too often to bisect it alone
(measured: docs/history.md). Such a finding says so, and its hunt covers the two segments around the cut."""
"""A creep's slope must lie this many standard errors from flat (one-sided; the standard error from the series'
noise). Not 4: the noise is estimated from the series itself, and an estimate 25% low turns 4 into 3. Measured on
2,000 seeded step-free series of 50 points at CV 0.6% and 2.7%: at 4, up to 33 series (1.7%) had a false creep; at
5, at most 2 (0.1%)."""
STEP_OR_LINE = 2 * math.log(WINDOW)
"""Where a step was found in a creep's stretch, a line must fit it better than the best single step by this many
noise variances to be the creep: the step also chooses where it splits (one of WINDOW places), which buys it a
better fit by chance (a BIC-like allowance of 2 log WINDOW)."""
WORSE = {"tokens/s": "lower"}
"""The direction that is worse, where it is not higher (a loss at a fixed step is news either way)."""
BISECT = {"tokens/s": "tokens_per_s", "peak memory": "peak_memory", "loss": "loss"}
"""bisect --metric for each metric it can hunt (bisection.METRICS); work counts are hunted with compare."""
NO_COMMIT = ("", "unversioned", "unknown")
"""pytest-benchmark's commit id outside git ('unversioned') or where git failed ('unknown')."""
UNHUNTED = ("val loss",)
"""Metrics neither bisect nor compare measures (a convergence run's final validation loss)."""


@dataclass
class Point:
    commit: str
    time: str
    value: float
    env: dict = field(default_factory=dict)
    """What else could move a figure between runs: torch's version, the CPU model."""


@dataclass
class Finding:
    """A change point (or a creeping stretch) of one case's metric."""

    case: str
    metric: str
    kind: str
    """'step' or 'creep'."""
    before: str
    """The last commit before the change."""
    after: str
    """The first commit after it (a creep: its last commit)."""
    change: float
    """after - before: a step's mean shift; a creep's last commit against its first."""
    relative: float | None
    p: float | None
    """Significance (None: exact metric)."""
    points_after: int
    status: str
    """regression, improvement, changed (a loss at a fixed step: either direction is news), suspicious, or
    creeping."""
    note: str = ""
    hunt: tuple[str, str] | None = None
    """(last commit before, last commit) that the hunt covers where the step's place is uncertain (:func:`_place`):
    its (before, after] is then a best guess."""

    @property
    def uncertain(self) -> bool:
        """The step's place is uncertain: its hunt covers a wider range than (before, after]."""
        return self.hunt is not None

    def size(self) -> str:
        """The change as text: '+8,915,712 (+43.2%)', '-0.111657 (-3.0%)'; 'NaN' or 'inf' where it became that."""
        if not math.isfinite(self.change):
            return "NaN" if math.isnan(self.change) else f"{self.change:+}"
        number = f"{self.change:+,.0f}" if abs(self.change) >= 1000 else f"{self.change:+.6g}"
        return number + (f" ({self.relative:+.1%})" if self.relative is not None else "")

    def line(self) -> str:
        where = f"between {self.before[:12]} and {self.after[:12]}"
        how = "exact" if self.p is None else f"p {self.p:.1e}"
        return f"{self.case} {self.metric}: {self.size()} {where} ({how}; {self.note}): {self.status}"

    def command(self) -> str | None:
        """What hunts the commit: bisect for its metrics, compare (which names the operators) for work counts;
        None where there is nothing to hunt (an improvement, a suspicious point, a metric neither measures)."""
        if self.status not in ("regression", "creeping", "changed") or self.metric in UNHUNTED:
            return None
        case_id = self.case.split("[", 1)[-1].rstrip("]")
        before, after = self.hunt or (self.before, self.after)
        metric = "loss" if self.metric.startswith("loss@") else self.metric
        if metric in BISECT:
            # bisect calls a commit slower beyond --threshold (default 5%): half this change, so that it is seen
            threshold = (
                f" --threshold {max(MIN_STEP, round(abs(self.relative) / 2, 3)):g}"
                if metric == "tokens/s" and self.relative is not None
                else ""
            )
            return (
                f"python -m gptcore bisect {before[:12]} {after[:12]} -k {case_id} --metric {BISECT[metric]}{threshold}"
            )
        return f"python -m gptcore compare {before[:12]} {after[:12]} -k {case_id}"


@dataclass
class History:
    """Every series read and what was found in it, with one line per thing left out."""

    findings: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    series: int = 0
    """Series read."""
    analysed: int = 0
    """Series with enough points to analyse."""
    runs: int = 0
    commits: list[str] = field(default_factory=list)
    """The commits read, oldest first."""
    device: str | None = None

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "runs": self.runs,
            "commits": self.commits,
            "series": self.series,
            "analysed": self.analysed,
            "skipped": self.skipped,
            "findings": [asdict(f) | {"uncertain": f.uncertain, "command": f.command()} for f in self.findings],
        }


# -- reading -------------------------------------------------------------------------------------------------------


def _metrics(info: dict) -> dict[str, tuple[float, bool]]:
    """A saved case's metrics: name -> (value, exact). tokens/s only on a GPU (on CPU the gate does not gate it)."""
    from gptcore.gate.baselines import Tolerances

    device = str(info.get("device") or "cpu")
    cpu = device.startswith("cpu")
    out: dict[str, tuple[float, bool]] = {}
    convergence = info.get("convergence")
    if isinstance(convergence, dict) and convergence.get("val_loss"):
        return {"val loss": (float(convergence["val_loss"][-1]), False)}
    speed_gated = Tolerances.default_for("cpu" if cpu else "cuda").speed is not None
    if speed_gated and _number(info.get("tokens_per_s")):
        out["tokens/s"] = (float(info["tokens_per_s"]), False)
    if _number(info.get("peak_allocated_bytes")):
        out["peak memory"] = (float(info["peak_allocated_bytes"]), cpu)
    if _number(info.get("loss")):
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
            if isinstance(value, (int, float)):
                out[name.replace("_", " ")] = (float(value), True)
    return out


def _number(value: object) -> bool:
    """A figure: an int or a float, NaN and inf included (a diverged run's loss is data); null or absent is not."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def utc_time(text: str) -> datetime | None:
    """An ISO time (git's %cI, with its offset) as UTC; None when unreadable."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def read(storage: str | Path, select: str | None = None) -> tuple[dict[tuple[str, str], list[Point]], dict, History]:
    """The series of every (case, metric) in the saved runs under ``storage`` (the files themselves, its
    machine-id folders, or a level deeper: .benchmarks/<device>/<machine>), in commit order; which metrics are
    exact; and a History holding one line per run left out. ValueError for a folder that is missing or holds no
    saved run."""
    storage = Path(str(storage).removeprefix("file://"))
    if not storage.is_dir():
        raise ValueError(f"{storage}: no such directory (pytest-benchmark's storage, e.g. .benchmarks/cpu)")
    pattern = "[0-9][0-9][0-9][0-9]_*.json"
    paths = [p for depth in ("", "*/", "*/*/") for p in sorted(storage.glob(depth + pattern))]
    if not paths:
        raise ValueError(f"{storage}: no saved pytest-benchmark run (save some with --benchmark-autosave)")
    history, loaded = History(), []
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    for path in paths:
        name = str(path.relative_to(storage))
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            history.skipped.append(f"{name}: not a readable run ({type(err).__name__})")
            continue
        info = data.get("commit_info") or {}
        commit = str(info.get("id") or "")
        if commit in NO_COMMIT:
            history.skipped.append(f"{name}: no commit recorded ({commit or 'none'}: saved outside git; left out)")
            continue
        if info.get("dirty"):
            history.skipped.append(
                f"{name}: saved from uncommitted changes to {commit[:12]} (left out: not that commit's figure)"
            )
            continue
        machine = data.get("machine_info") or {}
        ran = utc_time(str(data.get("datetime") or "")) or epoch
        committed = utc_time(str(info.get("time") or "")) or ran
        env = {k: str(machine[k]) for k in ("torch", "cpu_model") if machine.get(k)}
        loaded.append((committed, ran, name, commit, str(machine.get("device_slug") or "?"), env, data))
    slugs = [run[4] for run in loaded]
    device = max(sorted(set(slugs)), key=slugs.count) if slugs else None
    history.device = device
    # commits by commit time (ties: the commit first run earlier), each commit's runs together, oldest first
    first: dict[str, tuple[datetime, datetime]] = {}
    for committed, ran, _, commit, slug, _, _ in loaded:
        if slug == device:
            first[commit] = min(first.get(commit, (committed, ran)), (committed, ran))
    series: dict[tuple[str, str], list[Point]] = {}
    exact: dict[tuple[str, str], bool] = {}
    runs_of: dict[str, int] = {}
    for committed, _ran, name, commit, slug, env, data in sorted(
        loaded, key=lambda r: (first.get(r[3], (r[0], r[1])), r[3], r[1], r[2])
    ):
        if slug != device:
            history.skipped.append(f"{name}: device {slug}, not {device} like the rest (left out)")
            continue
        history.runs += 1
        if commit not in history.commits:
            history.commits.append(commit)
        for bench in data.get("benchmarks") or []:
            case = str(bench.get("name", ""))
            if select and select not in case:
                continue
            runs_of[case] = runs_of.get(case, 0) + 1
            for metric, (value, is_exact) in _metrics(bench.get("extra_info") or {}).items():
                series.setdefault((case, metric), []).append(Point(commit, committed.isoformat(), value, env))
                exact[(case, metric)] = is_exact
    for (case, metric), points in sorted(series.items()):  # null or absent in some runs: skipped, as asv does
        if len(points) < runs_of[case]:
            history.skipped.append(
                f"{case} {metric}: {runs_of[case] - len(points)} of {runs_of[case]} run(s) have no value (skipped)"
            )
    return series, exact, history


# -- finding -------------------------------------------------------------------------------------------------------


def _status(metric: str, change: float, points_after: int) -> str:
    """PyTorch HUD's rule: fewer than 2 points after the step, suspicious; else by the metric's worse direction."""
    if points_after < 2:
        return "suspicious"
    if metric.startswith("loss@"):
        return "changed"
    worse = WORSE.get(metric, "higher")
    return "regression" if (change > 0) == (worse == "higher") else "improvement"


def _moved(a: Point, b: Point) -> str:
    """'; torch 2.11.0 -> 2.13.0 between these runs' where the environment changed too (empty where not)."""
    moved = [
        f"{k} {a.env[k]} -> {b.env[k]}"
        for k in ("torch", "cpu_model")
        if a.env.get(k) and b.env.get(k) and a.env[k] != b.env[k]
    ]
    return f"; {', '.join(moved)} between these runs" if moved else ""


def exact_steps(case: str, metric: str, points: list[Point], notes: list[str] | None = None) -> list[Finding]:
    """Every commit at which an exact metric changed. A commit's repeated runs count once; where they differ (an
    exact metric that is not, here) ``notes`` gets one line and the commit's most frequent value stands."""
    commits: dict[str, list[Point]] = {}
    for p in points:
        commits.setdefault(p.commit, []).append(p)
    order, values = list(commits), []
    for commit, runs in commits.items():
        seen = [p.value for p in runs]
        if len(set(seen)) > 1 and notes is not None:
            notes.append(
                f"{case} {metric}: the runs of {commit[:12]} differ ({', '.join(f'{v:g}' for v in seen)}): "
                f"not exact here; its most frequent value is used"
            )
        values.append(max(seen, key=seen.count))
    found = []
    for i in range(1, len(order)):
        if values[i] == values[i - 1]:
            continue
        j = i
        while j < len(order) and values[j] == values[i]:
            j += 1
        change = values[i] - values[i - 1]
        a, b = commits[order[i - 1]][-1], commits[order[i]][0]
        found.append(
            Finding(
                case,
                metric,
                "step",
                order[i - 1],
                order[i],
                change,
                change / values[i - 1] if values[i - 1] else None,
                None,
                j - i,
                _status(metric, change, j - i),
                f"{j - i} commit(s) at the new value{_moved(a, b)}",
            )
        )
    return found


def non_finite(case: str, metric: str, points: list[Point]) -> Finding:
    """The first commit at which a metric became NaN or inf (a diverged run): a regression, named by the commit
    range from the last finite value before it, however little else of the series can be analysed."""
    first = next(i for i, p in enumerate(points) if not math.isfinite(p.value))
    before = next(
        (p.commit for p in reversed(points[:first]) if p.commit != points[first].commit), points[first].commit
    )
    value = points[first].value
    what = "NaN" if math.isnan(value) else "inf" if value > 0 else "-inf"
    after = sum(1 for p in points[first:] if not math.isfinite(p.value))
    name = "loss" if metric.startswith("loss@") else metric
    return Finding(
        case,
        metric,
        "non-finite",
        before,
        points[first].commit,
        value,
        None,
        None,
        after,
        "regression",
        f"{name} became {what} at {points[first].commit[:12]}; {after} run(s) not finite",
    )


def noise(values: Sequence[float]) -> float:
    """The series' point-to-point noise (standard deviation), robust to steps: the median absolute first
    difference / (0.6745 x sqrt 2)."""
    diffs = [abs(b - a) for a, b in zip(values, values[1:])]
    return statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs else 0.0


def trend_noise(values: Sequence[float]) -> float:
    """The noise (standard deviation) robust to a slope as well as to steps: the median absolute second
    difference / (0.6745 x sqrt 6). A creep shifts every first difference; it leaves second differences alone."""
    second = [abs(c - 2 * b + a) for a, b, c in zip(values, values[1:], values[2:])]
    return statistics.median(second) / (0.6745 * math.sqrt(6)) if second else 0.0


def _floor(values: Sequence[float], sigma: float) -> float:
    """sigma, or a sliver of the level where the series is constant (a GPU's memory): any step is then plain."""
    return sigma or 1e-12 * (abs(statistics.mean(values)) or 1.0)


def _welch(after: Sequence[float], before: Sequence[float]) -> float:
    from scipy import stats

    if min(len(before), len(after)) < 2:
        return 1.0
    with warnings.catch_warnings():  # constant segments: scipy warns of precision loss, and the p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(after, before, equal_var=False).pvalue)
    return 0.0 if math.isnan(p) and statistics.mean(after) != statistics.mean(before) else p


def noisy_steps(case: str, metric: str, points: list[Point]) -> list[Finding]:
    """The mean shifts of a noisy series: ruptures' PELT on the series in units of its noise, then a step in the
    last one or two commits (see :func:`tail_step`)."""
    import numpy as np
    import ruptures

    values = [p.value for p in points]
    sigma = _floor(values, noise(values))
    z = (np.asarray(values) - statistics.median(values)) / sigma
    cuts = (
        ruptures.Pelt(model="l2", min_size=MIN_SIZE, jump=1)
        .fit(z.reshape(-1, 1))
        .predict(pen=PENALTY * math.log(len(values)))
    )
    bounds, found, last = [0, *cuts], [], 0
    for k in range(1, len(bounds) - 1):
        start, cut, end = bounds[k - 1], bounds[k], bounds[k + 1]
        while 0 < cut < len(points) and points[cut - 1].commit == points[cut].commit:  # cut between commits
            cut -= 1
        if not start < cut < end:
            continue
        before, after = values[start:cut], values[cut:end]
        mean_before, mean_after = statistics.mean(before), statistics.mean(after)
        relative = mean_after / mean_before - 1 if mean_before else None
        p = _welch(after, before)
        if relative is None or abs(relative) < MIN_STEP or not p < P_MAX:
            continue
        change, last = mean_after - mean_before, cut
        lo, hi = _ambiguous(values, start, cut, end, (mean_before + mean_after) / 2, sigma)
        finding = Finding(
            case,
            metric,
            "step",
            points[lo - 1].commit,
            points[hi].commit,
            change,
            relative,
            p,
            end - cut,
            _status(metric, change, end - cut),
            f"{end - cut} point(s) after{_moved(points[lo - 1], points[hi])}",
        )
        # the series' noise estimate from few points can come out low: the segments' own spread counts too
        spread = max(sigma, statistics.stdev(before), statistics.stdev(after))
        found.append(_place(finding, abs(change) / sigma, spread / abs(mean_before), points[start], points[end - 1]))
    tail = tail_step(case, metric, points, last, sigma)  # against what follows the last step that counted
    return found + ([tail] if tail else [])


def tail_step(case: str, metric: str, points: list[Point], start: int, sigma: float) -> Finding | None:
    """A step in the last 2 commits, or else the last 1, after the segment that begins at ``start``: too few points
    for PELT's segments, so judged against the segment before them with the larger of the series' noise and that
    segment's standard deviation (a noise estimated from few points may be low). Each of the tail's
    points must lie past the midpoint (a step, not one outlier), the step must be at least MIN_STEP and Z_TAIL
    sigmas. With 2 commits after it HUD calls it a regression or improvement, with 1 suspicious."""
    commits = list(dict.fromkeys(p.commit for p in points[start:]))
    for m in (2, 1):
        if len(commits) <= m:
            continue
        first = next(i for i in range(start, len(points)) if points[i].commit == commits[-m])
        before, after = [p.value for p in points[start:first]], [p.value for p in points[first:]]
        if len(before) < MIN_SIZE:
            continue
        mean_before, mean_after = statistics.mean(before), statistics.mean(after)
        change, middle = mean_after - mean_before, (mean_before + mean_after) / 2
        # the noise of few points may be estimated low: the larger of the series' and the segment's own
        scale = max(sigma, statistics.stdev(before))
        z = change / (scale * math.sqrt(1 / len(after) + 1 / len(before)))
        if (
            not mean_before
            or abs(change / mean_before) < MIN_STEP
            or abs(z) < Z_TAIL
            or not all((v - middle) * change > 0 for v in after)
        ):
            continue
        p, where, step_at = math.erfc(abs(z) / math.sqrt(2)), "at the end of the history", points[first]
        last = next(i for i in range(first, len(points)) if points[i].commit == commits[-1])
        if m == 2 and abs(statistics.mean(after[: last - first]) - middle) < AMBIGUOUS * scale:
            # the first of the two could be either side's: the step is in one of them, and only the last confirms it
            after, where, step_at = (
                after[last - first :],
                "at the end of the history, in one of the last 2 commits",
                points[last],
            )
        finding = Finding(
            case,
            metric,
            "step",
            points[first - 1].commit,
            step_at.commit,
            change,
            change / mean_before,
            p,
            len(after),
            _status(metric, change, len(after)),
            f"{len(after)} point(s) after, {where}{_moved(points[first - 1], step_at)}",
        )
        return _place(finding, abs(change) / scale, scale / abs(mean_before), points[start], points[-1])
    return None


def _place(finding: Finding, size: float, cv: float, first: Point, last: Point) -> Finding:
    """``finding`` with its place marked uncertain where the step is under Z_PLACE noise sigmas (``size``) or the
    series' relative noise (``cv``) is over CV_PLACE: its hunt then covers the segments around the cut, from
    ``first`` to ``last``, which held the commit in every such finding measured (docs/history.md)."""
    why = (
        f"the step is {size:.1f} noise sigmas (under {Z_PLACE:g})"
        if size < Z_PLACE
        else f"the series' noise is {cv:.1%} a point (over {CV_PLACE:.1%})"
        if cv > CV_PLACE
        else None
    )
    if why and first.commit != last.commit:
        finding.hunt = (first.commit, last.commit)
        finding.note += (
            f"; place uncertain: {why}, its range may miss the commit: hunt over {first.commit[:12]}.."
            f"{last.commit[:12]}"
        )
    return finding


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


def _line(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> tuple[float, float, float, float]:
    """Weighted least squares (w: the points behind each mean): (slope, mean of y, sum of w (x - mean x)^2, the
    residual sum of squares); the slope's standard error is the points' noise / sqrt of the third."""
    total = sum(ws)
    mx, my = sum(w * x for x, w in zip(xs, ws)) / total, sum(w * y for y, w in zip(ys, ws)) / total
    sxx = sum(w * (x - mx) ** 2 for x, w in zip(xs, ws))
    slope = sum(w * (x - mx) * (y - my) for x, y, w in zip(xs, ys, ws)) / sxx
    return slope, my, sxx, sum(w * (y - my - slope * (x - mx)) ** 2 for x, y, w in zip(xs, ys, ws))


def _step_rss(ys: Sequence[float], ws: Sequence[float]) -> float:
    """The residual sum of squares of the best single step (two means, split anywhere) through ys."""

    def rss(part: range) -> float:
        mean = sum(ws[i] * ys[i] for i in part) / sum(ws[i] for i in part)
        return sum(ws[i] * (ys[i] - mean) ** 2 for i in part)

    return min(rss(range(k)) + rss(range(k, len(ys))) for k in range(1, len(ys)))


def creeping(
    case: str, metric: str, points: list[Point], tolerance: float | None, steps: Sequence[Finding] = ()
) -> list[Finding]:
    """Stretches of commits whose per-commit means slope the worse way, Z_CREEP standard errors from flat (the
    series' noise), adding up to ``tolerance`` or more (relative; the validation loss: nats) over WINDOW
    commit-to-commit changes. Overlapping such windows make one stretch, trimmed at either end while that makes it
    steeper (flat commits next to a creep are not part of it) and refitted: '-1.0% per commit over 6 commits'.
    Where one of ``steps`` (this series' step changes) lies in a stretch and one step fits the stretch as well as a
    line, it is that step and no creep."""
    if tolerance is None:
        return []
    commits: dict[str, list[float]] = {}
    for p in points:
        commits.setdefault(p.commit, []).append(p.value)
    names = list(commits)
    means, counts = [statistics.mean(v) for v in commits.values()], [len(v) for v in commits.values()]
    values = [p.value for p in points]
    sigma = _floor(values, trend_noise(values))
    relative = metric != "val loss"
    worse_lower = WORSE.get(metric) == "lower"

    def fit(a: int, b: int) -> tuple[float, float, float, float]:
        """(per-commit change, total over commits a..b, z from flat, line RSS - best step RSS) of a..b."""
        slope, level, sxx, rss = _line(range(b - a + 1), means[a : b + 1], counts[a : b + 1])
        # a window whose mean is 0 has no relative slope: no creep (a step from 0 is found as a step)
        per = (slope / abs(level) if level else 0.0) if relative else slope
        return (
            per,
            per * (b - a),
            slope / (sigma / math.sqrt(sxx)),
            rss - _step_rss(means[a : b + 1], counts[a : b + 1]),
        )

    def qualifies(a: int, b: int) -> bool:
        per, total, z, _ = fit(a, b)
        worse = total < 0 if worse_lower else total > 0
        return worse and abs(total) >= tolerance and abs(z) >= Z_CREEP

    stretches: list[list[int]] = []
    for i in range(len(means) - WINDOW):
        if qualifies(i, i + WINDOW):
            if stretches and i <= stretches[-1][1]:
                stretches[-1][1] = i + WINDOW
            else:
                stretches.append([i, i + WINDOW])
    found = []
    for a, b in stretches:
        while b - a > WINDOW:
            steeper = max(((a + 1, b), (a, b - 1)), key=lambda ab: abs(fit(*ab)[0]))
            if abs(fit(*steeper)[0]) <= abs(fit(a, b)[0]) or not qualifies(*steeper):
                break
            a, b = steeper
        per, total, z, line_minus_step = fit(a, b)
        if line_minus_step > -STEP_OR_LINE * sigma**2 and any(_within(f, names[a : b + 1]) for f in steps):
            continue
        # the change: what the stretch's last commit reads against its first (a line through a short creep with
        # flat commits beside it is steeper than the creep; its slope is the note)
        change = means[b] - means[a]
        unit = f"{per:+.1%}" if relative else f"{per:+.4f} nats"
        found.append(
            Finding(
                case,
                metric,
                "creep",
                names[a],
                names[b],
                change,
                change / abs(means[a]) if relative and means[a] else None,
                0.5 * math.erfc(abs(z) / math.sqrt(2)),
                b - a,
                "creeping",
                f"{unit} per commit over {b - a} commits",
            )
        )
    return found


def _within(step: Finding, stretch: Sequence[str]) -> bool:
    """The step's commit range lies in the stretch of commits."""
    return step.kind == "step" and step.before in stretch and step.after in stretch[1:]


def changes(case: str, metric: str, points: list[Point], tolerance: float | None) -> list[Finding]:
    """A noisy series' steps and creeps, each change once: a step that lies in a creep (a line fits that stretch
    better than a step) is part of the creep."""
    steps = noisy_steps(case, metric, points)
    creeps = creeping(case, metric, points, tolerance, steps)
    commits = list(dict.fromkeys(p.commit for p in points))
    spans = [commits[commits.index(c.before) : commits.index(c.after) + 1] for c in creeps]
    return [s for s in steps if not any(_within(s, span) for span in spans)] + creeps


def analyse(storage: str | Path, select: str | None = None) -> History:
    """Every change point and creeping stretch in the saved runs under ``storage`` (``select``: a substring of the
    case names)."""
    from gptcore.gate.baselines import Tolerances

    series, exact, history = read(storage, select)
    tol = Tolerances.default_for("cpu" if history.device == "cpu" else "cuda")
    creep_tolerance = {"tokens/s": tol.speed, "peak memory": tol.memory, "val loss": tol.val_loss}
    short: dict[str, list[str]] = {}
    for (case, metric), points in sorted(series.items()):
        history.series += 1
        if any(not math.isfinite(p.value) for p in points):  # a finding of its own, then the finite rest
            history.findings.append(non_finite(case, metric, points))
            points = [p for p in points if math.isfinite(p.value)]
            if not points:
                continue
        if exact[(case, metric)]:
            history.analysed += 1
            history.findings += exact_steps(case, metric, points, history.skipped)
            continue
        if len(points) < 2 * MIN_SIZE:
            short.setdefault(case, []).append(f"{metric} ({len(points)})")
            continue
        history.analysed += 1
        history.findings += changes(case, metric, points, creep_tolerance.get(metric))
    for case, metrics in short.items():
        history.skipped.append(
            f"{case}: fewer points than the {2 * MIN_SIZE} the change-point search needs: "
            f"{', '.join(metrics)} (left out)"
        )
    return history


def section(storage: str | Path) -> str:
    """The markdown section for the saved runs under ``storage`` (the gate's --gate-history); a line saying why
    not where they cannot be read."""
    try:
        return markdown(analyse(storage))
    except ValueError as err:
        return f"### Change points in history\n\nNot analysed: {err}\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")


def markdown(history: History) -> str:
    """The "Change points in history" section of the markdown verdict: a table of the findings, then the command
    that hunts each regression."""
    out = ["### Change points in history", ""]
    where = f"{history.series} series over {history.runs} saved run(s) of {len(history.commits)} commit(s)"
    if not history.findings:
        out.append(f"None in {where}.")
    else:
        out += [
            f"{len(history.findings)} in {where}.",
            "",
            "| case | metric | change | commits | significance | status |",
            "|---|---|---|---|---|---|",
        ]
        for f in history.findings:
            out.append(
                f"| {_md(f.case)} | {f.metric} | {f.size()} | {f.before[:7]}..{f.after[:7]} | "
                f"{'exact' if f.p is None else f'p {f.p:.1e}'} | {f.status} ({_md(f.note)}) |"
            )
        hunts = list(dict.fromkeys(f.command() for f in history.findings if f.command()))
        if hunts:
            out += ["", "Hunt each one:", "", "```bash", *hunts, "```"]
    if history.skipped:
        out += [
            "",
            f"<details><summary>left out ({len(history.skipped)})</summary>",
            "",
            *(f"- {_md(line)}" for line in history.skipped),
            "",
            "</details>",
        ]
    return "\n".join(out + [""])
