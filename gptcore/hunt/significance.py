"""The statistics of an A/B comparison, pure functions: Mann-Whitney U (exact for small samples without ties),
the Hodges-Lehmann interval of the ratio B/A on log tokens/s and the speed verdict. (Memory and loss of two runs
are judged by the gate's own checks, ``checks.memory_check`` and ``checks.loss_check``.) Deterministic: no
random numbers.

Written here rather than taken from scipy.stats.mannwhitneyu on purpose: the project does not depend on scipy
(pyproject.toml), and one rank test does not justify a large dependency: the exact distribution is a short
recurrence and the rest is the normal approximation. The exact branch is checked against the definition itself:
tests/test_compare.py enumerates every split of small pooled samples (up to 4 against 6) and compares U, the
distribution of U and the two-sided p. The normal approximation (ties, or m*n > 2,500) is checked only where its
answer is known (identical samples: p = 1), not against another implementation."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SLOWER, FASTER, SAME = "slower", "faster", "same"


def u_distribution(m: int, n: int) -> list[int]:
    """Counts of each value 0..m*n of the Mann-Whitney U statistic over all C(m+n, m) orderings without ties."""
    # dp[i][j]: distribution for i values of A and j of B; the largest value is A's (adds 0) or B's (adds i)
    dp = [[[1] for _ in range(n + 1)] for _ in range(m + 1)]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            left, down = dp[i - 1][j], dp[i][j - 1]
            out = [0] * (i * j + 1)
            for u, c in enumerate(left):
                out[u] += c
            for u, c in enumerate(down):
                out[u + i] += c
            dp[i][j] = out
    return dp[m][n]


def _has_ties(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(set(a) | set(b)) < len(a) + len(b)


def _exact(m: int, n: int, a: Sequence[float], b: Sequence[float]) -> bool:
    return m * n <= 2500 and not _has_ties(a, b)


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(U, two-sided p) for ``b`` against ``a``; U counts the pairs with b > a (ties 1/2). Exact without ties on
    small samples, else the normal approximation with tie and continuity corrections."""
    m, n = len(a), len(b)
    if not m or not n:
        raise ValueError("mann_whitney: both samples need at least one value")
    u = sum(1.0 if y > x else 0.5 if y == x else 0.0 for x in a for y in b)
    if _exact(m, n, a, b):
        counts = u_distribution(m, n)
        total = sum(counts)
        k = int(u)
        low, high = sum(counts[: k + 1]) / total, sum(counts[k:]) / total
        return u, min(1.0, 2 * min(low, high))
    values = sorted(list(a) + list(b))
    big = m + n
    ties = sum(t**3 - t for t in (values.count(v) for v in set(values)))
    var = m * n / 12 * ((big + 1) - ties / (big * (big - 1)))
    if var <= 0:
        return u, 1.0
    z = max(0.0, abs(u - m * n / 2) - 0.5) / math.sqrt(var)
    return u, min(1.0, math.erfc(z / math.sqrt(2)))


def _critical_count(m: int, n: int, alpha: float, exact: bool) -> int:
    """C: the largest count with P(U <= C - 1) <= alpha/2 (0: the samples are too small for the interval)."""
    if exact:
        counts, total, below, c = u_distribution(m, n), math.comb(m + n, m), 0, 0
        while c < len(counts) and (below + counts[c]) / total <= alpha / 2:
            below += counts[c]
            c += 1
        return c
    z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
    return max(0, math.floor(m * n / 2 - z * math.sqrt(m * n * (m + n + 1) / 12)))


def hodges_lehmann_ratio(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> tuple[float, float | None, float | None]:
    """(estimate, low, high) of the ratio b/a of positive samples: the median of all pairwise log differences and
    its distribution-free interval from the Mann-Whitney critical value; low/high are None when the samples are
    too small for that confidence (3 against 3 cannot reach 95%)."""
    if min(list(a) + list(b)) <= 0:
        raise ValueError("hodges_lehmann_ratio: samples must be positive")
    diffs = sorted(math.log(y) - math.log(x) for x in a for y in b)
    estimate = math.exp(statistics.median(diffs))
    c = _critical_count(len(a), len(b), 1 - confidence, _exact(len(a), len(b), a, b))
    if c < 1:
        return estimate, None, None
    return estimate, math.exp(diffs[c - 1]), math.exp(diffs[len(diffs) - c])


@dataclass
class Speed:
    """Tokens/s of A and B over rounds, and what they say."""

    median_a: float
    median_b: float
    ratio: float
    """median(B) / median(A): below 1 means B is slower."""
    hodges_lehmann: float
    low: float | None
    high: float | None
    """95% interval of the ratio (None: too few rounds for one)."""
    p: float
    """Mann-Whitney two-sided p-value."""
    verdict: str


def speed_verdict(a: Sequence[float], b: Sequence[float], threshold: float = 0.05, confidence: float = 0.95) -> Speed:
    """Slower/faster only when the ratio of medians is beyond ``threshold`` AND the interval excludes 1."""
    median_a, median_b = statistics.median(a), statistics.median(b)
    ratio = median_b / median_a
    hl, low, high = hodges_lehmann_ratio(a, b, confidence)
    _, p = mann_whitney(a, b)
    verdict = SAME
    if high is not None and high < 1 and ratio < 1 - threshold:
        verdict = SLOWER
    elif low is not None and low > 1 and ratio > 1 + threshold:
        verdict = FASTER
    return Speed(median_a, median_b, ratio, hl, low, high, p, verdict)
