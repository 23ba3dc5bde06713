"""The change-point detector: values in, indices out. It knows nothing of benchmarks, commits or saved runs (like
asv's ``step_detect``): ``gptcore.hunt.history`` turns a saved series into values and the indices found here back
into commit ranges.

- :func:`steps`: mean shifts of a noisy series, by ruptures' PELT (a penalised least-squares search) on the series
  in units of its point-to-point noise; a cut counts when its step is at least :data:`MIN_STEP` and a Welch t-test
  between the segments gives p < :data:`P_MAX`;
- :func:`tail`: a step in the last one or two groups of points (a commit's repeated runs are a group), too short
  for a segment, counted when it lies :data:`Z_TAIL` noise sigmas off the segment before it;
- :func:`stretches`: per-group means that slope the worse way over :data:`WINDOW` groups or more, :data:`Z_CREEP`
  standard errors from flat and adding up past a tolerance;
- :func:`uncertain_place`: whether a step's place is too uncertain to bisect it alone.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

MIN_STEP = 0.01
"""A noisy metric's smallest step that counts (Chromium's dashboard: 1%). Below the gate's tolerances on purpose:
a step inside one run's noise is what history is for."""
PENALTY = 6.0
"""PELT's penalty per change point, times log(n), on the series in units of its noise."""
P_MAX = 1e-4
"""A noisy step counts when the two segments differ at this significance (Welch's t-test). With PENALTY, chosen on
seeded step-free series of 50 points (docs/history.md, by scripts/history_rates.py): 1 to 5 of 2,000 series with a
false change (0.05-0.25%, creeps included), where the first version's 4 log n and p < 1e-3 gave 2 to 10; a 3% step
with 8 points after it at CV 0.6% is found in 1,000 of 1,000."""
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
"""A creep's slope must lie this many standard errors from flat (one-sided; the standard error from the series'
noise). Not 4: the noise is estimated from the series itself, and an estimate 25% low turns 4 into 3. Measured on
2,000 seeded step-free series of 50 points a row (tokens/s and peak memory at CV 0.6% and 2.7%; docs/history.md,
scripts/history_rates.py): at 4, 0 to 27 series (up to 1.35%) had a false creep; at 5, 0 to 3 (up to 0.15%)."""
CV_PLACE = 0.015
"""A noisy series whose point-to-point noise is more than this, relative to its level (a hosted runner's 2.7%), has
no certain place for any step or creep: one found there is found where noise made it look larger. Measured
(docs/history.md): a 3% drop at 2.7% noise, found in 60 of 1,000 series as 47 steps and 16 creeps, had the best-guess
range hold the commit in 41 of those 63 (65%; 22 missed), and the wider hunt in 61. Such findings say so."""
Z_PLACE = 3.0
"""A noisy step or creep smaller than this many noise sigmas (of one point) has an uncertain place: the points
beside it could belong to either side, and its commit range misses the commit that made it too often to bisect it
alone (measured: docs/history.md). Such a finding says so, and its hunt covers a wider range."""
STEP_OR_LINE = 2 * math.log(WINDOW)
"""Where a step was found in a creep's stretch, a line must fit it better than the best single step by this many
noise variances to be the creep: the step also chooses where it splits (one of WINDOW places), which buys it a
better fit by chance (a BIC-like allowance of 2 log WINDOW)."""


@dataclass
class Step:
    """A mean shift at ``cut``: points ``start..cut-1`` before it, ``cut..end-1`` after. ``lo..hi``: where it may
    lie (after point lo - 1, at or before point hi). ``size``: the shift in noise sigmas; ``cv``: the noise relative
    to the level before (after, where that is 0)."""

    start: int
    cut: int
    end: int
    lo: int
    hi: int
    change: float
    relative: float | None
    """change / the level before; None where that level is exactly 0."""
    p: float | None
    """Welch's (or, at the end, the normal) p; None for a step to or from exactly 0, which needs no test."""
    size: float
    cv: float


@dataclass
class Stretch:
    """A creep over groups ``a..b``: ``per`` a group (relative, or absolute where asked), ``z`` from flat, and how
    much better a line fits it than the best single step (``line_minus_step``, a residual sum of squares)."""

    a: int
    b: int
    per: float
    z: float
    line_minus_step: float


def noise(values: Sequence[float]) -> float:
    """The series' point-to-point noise (standard deviation), robust to steps: the median absolute first
    difference / (0.6745 x sqrt 2). Pairs with a point at exactly 0 are left out: a level of 0 has no noise, and
    its run would read as a quiet series."""
    diffs = [abs(b - a) for a, b in zip(values, values[1:]) if a and b]
    return statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs else 0.0


def trend_noise(values: Sequence[float]) -> float:
    """The noise (standard deviation) robust to a slope as well as to steps: the median absolute second
    difference / (0.6745 x sqrt 6). A creep shifts every first difference; it leaves second differences alone.
    Triples with a point at exactly 0 are left out, as in :func:`noise`."""
    second = [abs(c - 2 * b + a) for a, b, c in zip(values, values[1:], values[2:]) if a and b and c]
    return statistics.median(second) / (0.6745 * math.sqrt(6)) if second else 0.0


def floor(values: Sequence[float], sigma: float) -> float:
    """sigma, or a sliver of the level where the series is constant (a GPU's memory): any step is then plain."""
    return sigma or 1e-12 * (abs(statistics.mean(values)) or 1.0)


def welch(after: Sequence[float], before: Sequence[float]) -> float:
    """Welch's t-test p between two segments (1 where one has fewer than 2 points, 0 where both are constant
    and differ)."""
    from scipy import stats

    if min(len(before), len(after)) < 2:
        return 1.0
    with warnings.catch_warnings():  # constant segments: scipy warns of precision loss, and the p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(after, before, equal_var=False).pvalue)
    return 0.0 if math.isnan(p) and statistics.mean(after) != statistics.mean(before) else p


def runs(values: Sequence[float], groups: Sequence[object]) -> list[tuple[int, int, bool]]:
    """The series cut where it reaches or leaves exactly 0: (start, end, at zero) of each run, cut between groups
    (a group is at zero when all its points are). A level of exactly 0 (nothing allocated, nothing run, a feature
    off) has no noise to judge a move from: the move is a step, and each run away from 0 is searched on its own."""
    out: list[tuple[int, int, bool]] = []
    start = 0
    for end in range(1, len(values) + 1):
        if end < len(values) and groups[end] == groups[end - 1]:
            continue  # within a group
        zero = not any(values[start:end])
        if out and out[-1][2] == zero:
            out[-1] = (out[-1][0], end, zero)
        else:
            out.append((start, end, zero))
        start = end
    return out


def steps(values: Sequence[float], groups: Sequence[object]) -> tuple[list[Step], int, float]:
    """The mean shifts of a noisy series: ruptures' PELT on the series in units of its noise, each cut moved back
    to a boundary between groups (``groups[i]``: point i's group, e.g. its commit). Where the series reaches or
    leaves exactly 0 (:func:`runs`), that is a step of its own (``p`` None: no test needed, as for an exact
    metric) and each run away from 0 is searched alone, in units of its own noise. Returns the steps that count,
    the start of the segment after the last of them (where :func:`tail` looks), and the last run's noise."""
    import numpy as np
    import ruptures

    bounds, at_zero, sigmas = [0], set(), {}
    for start, end, zero in runs(values, groups):
        if start:
            at_zero.add(start)
        part = values[start:end]
        sigmas[start] = sigma = floor(part, noise(part))
        if not zero and len(part) >= 2 * MIN_SIZE:
            z = (np.asarray(part) - statistics.median(part)) / sigma
            cuts = (
                ruptures.Pelt(custom_cost=_l2_cost(), min_size=MIN_SIZE, jump=1)
                .fit(z.reshape(-1, 1))
                .predict(pen=PENALTY * math.log(len(part)))
            )
            bounds += [start + c for c in cuts[:-1]]
        bounds.append(end)
    found, last = [], 0
    for k in range(1, len(bounds) - 1):
        start, cut, end = bounds[k - 1], bounds[k], bounds[k + 1]
        before, after = values[start:cut], values[cut:end]
        mean_before, mean_after = statistics.mean(before), statistics.mean(after)
        change = mean_after - mean_before
        # from a level of exactly 0 no relative size (and no minimum): to 0, -100%
        relative = change / mean_before if mean_before else None
        if cut in at_zero:
            found.append(Step(start, cut, end, cut, cut, change, relative, None, math.inf, 0.0))
            last = cut
            continue
        while cut > start and groups[cut - 1] == groups[cut]:  # cut between groups
            cut -= 1
        if not start < cut:
            continue
        before, after = values[start:cut], values[cut:end]
        mean_before, mean_after = statistics.mean(before), statistics.mean(after)
        change = mean_after - mean_before
        relative = change / mean_before if mean_before else None
        p = welch(after, before)
        if (relative is not None and abs(relative) < MIN_STEP) or not p < P_MAX:
            continue
        sigma, last = sigmas[max(b for b in sigmas if b <= cut)], cut
        lo, hi = ambiguous(values, start, cut, end, (mean_before + mean_after) / 2, sigma)
        # the series' noise estimate from few points can come out low: the segments' own spread counts too
        spread = max(sigma, statistics.stdev(before), statistics.stdev(after))
        level = abs(mean_before) or abs(mean_after)
        found.append(Step(start, cut, end, lo, hi, change, relative, p, abs(change) / sigma, spread / level))
    return found, last, sigmas[max(sigmas)]


def _l2_cost() -> object:
    """ruptures' least-squares cost (its ``CostL2``: a segment's sum of squared deviations from its mean) from
    prefix sums, O(1) a segment where CostL2 takes a numpy variance of the slice: PELT asks for it some 600 times a
    50-point series. Measured here (200 seeded 50-point series): 1.6 ms of CPU a series against CostL2's 14.6 ms,
    and the same findings on 1,800 seeded series of docs/history.md's scenarios."""
    from ruptures.base import BaseCost
    from ruptures.costs import NotEnoughPoints

    class PrefixL2(BaseCost):
        model = "l2"
        min_size = 1

        def fit(self, signal: object) -> PrefixL2:
            self.signal, self.sums, self.squares = signal, [0.0], [0.0]
            for x in (float(v) for v in signal.reshape(-1)):  # type: ignore[attr-defined]
                self.sums.append(self.sums[-1] + x)
                self.squares.append(self.squares[-1] + x * x)
            return self

        def error(self, start: int, end: int) -> float:
            if end - start < self.min_size:
                raise NotEnoughPoints
            total = self.sums[end] - self.sums[start]
            return max(0.0, self.squares[end] - self.squares[start] - total * total / (end - start))

    return PrefixL2()


def tail(values: Sequence[float], groups: Sequence[object], start: int, sigma: float) -> Step | None:
    """A step in the last 2 groups, or else the last 1, after the segment that begins at ``start``: too few points
    for PELT's segments, so judged against the segment before them with the larger of the series' noise and that
    segment's standard deviation (a noise estimated from few points may be low). Each of the tail's points must lie
    past the midpoint (a step, not one outlier), the step must be at least MIN_STEP and Z_TAIL sigmas. The step's
    ``cut`` is the first point of the tail, ``hi`` the point it is placed at: the last group's first point where
    the first of two groups could be either side's (``hi > cut``), else ``cut``; ``lo`` is widened back over the
    points before the tail that lie within AMBIGUOUS of the midpoint, as :func:`ambiguous` does for a cut."""
    names = list(dict.fromkeys(groups[start:]))
    for m in (2, 1):
        if len(names) <= m:
            continue
        first = next(i for i in range(start, len(values)) if groups[i] == names[-m])
        before, after = list(values[start:first]), list(values[first:])
        if len(before) < MIN_SIZE:
            continue
        mean_before, mean_after = statistics.mean(before), statistics.mean(after)
        change, middle = mean_after - mean_before, (mean_before + mean_after) / 2
        # the noise of few points may be estimated low: the larger of the series' and the segment's own
        scale = max(sigma, statistics.stdev(before))
        z = change / (scale * math.sqrt(1 / len(after) + 1 / len(before)))
        relative = change / mean_before if mean_before else None  # from exactly 0: no relative size
        if (
            (relative is not None and abs(relative) < MIN_STEP)
            or abs(z) < Z_TAIL
            or not all((v - middle) * change > 0 for v in after)
        ):
            continue
        at = first
        last = next(i for i in range(first, len(values)) if groups[i] == names[-1])
        if m == 2 and abs(statistics.mean(after[: last - first]) - middle) < AMBIGUOUS * scale:
            # the first of the two could be either side's: the step is in one of them, and only the last confirms it
            at = last
        # the points before the tail within AMBIGUOUS of the midpoint could be the tail's too: its range holds them
        lo = ambiguous(values, start, first, len(values), middle, scale)[0]
        p = math.erfc(abs(z) / math.sqrt(2))
        return Step(start, first, len(values), lo, at, change, relative, p, abs(change) / scale,
                    scale / (abs(mean_before) or abs(mean_after)))  # fmt: skip
    return None


def uncertain_place(size: float, cv: float) -> str | None:
    """Why a step of ``size`` noise sigmas, in a series whose noise is ``cv`` of its level, has an uncertain place
    (under Z_PLACE sigmas, or noise over CV_PLACE); None where its place is certain."""
    if size < Z_PLACE:
        return f"the change is {size:.1f} noise sigmas (under {Z_PLACE:g})"
    if cv > CV_PLACE:
        return f"the series' noise is {cv:.1%} a point (over {CV_PLACE:.1%})"
    return None


def spread_around(values: Sequence[float], first: int, end: int, sigma: float) -> float:
    """The noise to judge a creep's place by, over points ``first..end-1``: the largest of ``sigma`` (the series'
    estimates) and the standard deviations of the points before and after the stretch. A creep is found where the
    series' noise came out low (its slope is measured against it), so that estimate alone would call its place
    certain in the very series where it is not (measured: docs/history.md)."""
    parts = [part for part in (values[:first], values[end:]) if len(part) >= 2]
    return max([sigma, *(statistics.stdev(part) for part in parts)])


def ambiguous(values: Sequence[float], start: int, cut: int, end: int, middle: float, sigma: float) -> tuple[int, int]:
    """The range a noisy step may lie in: the cut widened over the points next to it that are within AMBIGUOUS
    noise of the midpoint between the segments (either side could own them). Returns (lo, hi): the step is after
    point lo - 1 and at or before point hi."""
    lo, hi = cut, cut
    while lo - 1 > start and abs(values[lo - 1] - middle) < AMBIGUOUS * sigma:
        lo -= 1
    while hi + 1 < end and abs(values[hi] - middle) < AMBIGUOUS * sigma:
        hi += 1
    return lo, hi


def line(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> tuple[float, float, float, float]:
    """Weighted least squares (w: the points behind each mean): (slope, mean of y, sum of w (x - mean x)^2, the
    residual sum of squares); the slope's standard error is the points' noise / sqrt of the third."""
    total = sum(ws)
    mx, my = sum(w * x for x, w in zip(xs, ws)) / total, sum(w * y for y, w in zip(ys, ws)) / total
    sxx = sum(w * (x - mx) ** 2 for x, w in zip(xs, ws))
    slope = sum(w * (x - mx) * (y - my) for x, y, w in zip(xs, ys, ws)) / sxx
    return slope, my, sxx, sum(w * (y - my - slope * (x - mx)) ** 2 for x, y, w in zip(xs, ys, ws))


def step_rss(ys: Sequence[float], ws: Sequence[float]) -> float:
    """The residual sum of squares of the best single step (two means, split anywhere) through ys."""

    def rss(part: range) -> float:
        mean = sum(ws[i] * ys[i] for i in part) / sum(ws[i] for i in part)
        return sum(ws[i] * (ys[i] - mean) ** 2 for i in part)

    return min(rss(range(k)) + rss(range(k, len(ys))) for k in range(1, len(ys)))


def stretches(
    means: Sequence[float],
    counts: Sequence[int],
    sigma: float,
    tolerance: float,
    *,
    relative: bool = True,
    worse_lower: bool = False,
) -> list[Stretch]:
    """Stretches of groups whose means (``counts``: the points behind each) slope the worse way, Z_CREEP standard
    errors from flat (``sigma``: the points' noise), adding up to ``tolerance`` or more (relative, or absolute where
    ``relative`` is False) over WINDOW group-to-group changes. Overlapping such windows make one stretch, trimmed at
    either end while that makes it steeper (flat groups next to a creep are not part of it) and refitted."""

    def fit(a: int, b: int) -> tuple[float, float, float]:
        """(per-group change, total over groups a..b, z from flat) of a..b."""
        slope, level, sxx, _ = line(range(b - a + 1), means[a : b + 1], counts[a : b + 1])
        # a window that holds a group at exactly 0 has no relative slope (a level of 0 is no scale): no creep there,
        # the move from 0 or to 0 is a step and is found as one
        flat = relative and (not level or not all(means[a : b + 1]))
        per = 0.0 if flat else slope / abs(level) if relative else slope
        return per, per * (b - a), slope / (sigma / math.sqrt(sxx))

    def qualifies(a: int, b: int) -> bool:
        per, total, z = fit(a, b)
        worse = total < 0 if worse_lower else total > 0
        return worse and abs(total) >= tolerance and abs(z) >= Z_CREEP

    found: list[list[int]] = []
    for i in range(len(means) - WINDOW):
        if qualifies(i, i + WINDOW):
            if found and i <= found[-1][1]:
                found[-1][1] = i + WINDOW
            else:
                found.append([i, i + WINDOW])
    out = []
    for a, b in found:
        while b - a > WINDOW:
            steeper = max(((a + 1, b), (a, b - 1)), key=lambda ab: abs(fit(*ab)[0]))
            if abs(fit(*steeper)[0]) <= abs(fit(a, b)[0]) or not qualifies(*steeper):
                break
            a, b = steeper
        per, _, z = fit(a, b)
        rss = line(range(b - a + 1), means[a : b + 1], counts[a : b + 1])[3]
        out.append(Stretch(a, b, per, z, rss - step_rss(means[a : b + 1], counts[a : b + 1])))
    return out
