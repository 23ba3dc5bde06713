"""The one rule that judges a measured figure against its reference under a tolerance, and the one status
vocabulary every verdict uses (the gate, ``compare``, ``bisect``, the HTML report and the end table)."""

from __future__ import annotations

import enum
import math
from typing import Literal


class Status(str, enum.Enum):
    """What a check concluded. A str enum: it prints, compares and serializes as its text ("FAIL", "ok", ...). Written
    as ``enum.StrEnum`` (Python 3.11) does it by hand, since the project runs on Python 3.10 too."""

    OK = "ok"
    """Within tolerance (and unchanged, where a change is reported)."""
    CHANGED = "changed"
    """Moved, within tolerance (reported where any change is news: memory in ``compare``)."""
    BETTER = "better"
    """Better than the reference beyond tolerance: passes, with "refresh the baseline"."""
    FAIL = "FAIL"
    """Worse than the reference beyond tolerance."""
    NOT_GATED = "not gated"
    """Measured and shown, but this metric has no tolerance here (tokens/s on CPU)."""
    NO_FIGURE = "no figure"
    """One side has no figure to compare (a compiled case has no tracked peak on CPU)."""
    NO_BASELINE = "no baseline"
    """The case has no recorded reference."""

    def __str__(self) -> str:
        return self.value


Worse = Literal["higher", "lower", "either"]


def percent(fraction: float) -> str:
    """A relative tolerance as people read it, to three significant digits: 0.034 -> '3.4%', 0.005 -> '0.5%',
    0.02 -> '2%' (a plain ':.0%' prints the first two as '3%' and '0%')."""
    return f"{fraction * 100:.3g}%"


def delta(measured: float | None, reference: float | None, relative: bool) -> float | None:
    """measured / reference - 1 (relative) or measured - reference; None without both figures (or a zero
    reference for a relative delta)."""
    if measured is None or reference is None or (relative and not reference):
        return None
    return measured / reference - 1.0 if relative else measured - reference


def judge(
    measured: float | None,
    reference: float | None,
    tolerance: float | None,
    *,
    worse: Worse,
    relative: bool,
    report_change: bool = False,
) -> tuple[Status, float | None]:
    """(status, delta) of ``measured`` against ``reference``: FAIL beyond ``tolerance`` in the ``worse`` direction
    ("either": both ways), BETTER beyond it the other way (one-sided metrics only), else OK, or CHANGED when
    ``report_change`` and the figure moved at all. A ``tolerance`` of None means not gated. The delta is relative
    or absolute as asked (see ``delta``)."""
    if measured is not None and not math.isfinite(measured):  # NaN or inf (a diverged run): a failure whatever
        return Status.FAIL, None  # the tolerance; its check's note names it (non_finite)
    d = delta(measured, reference, relative)
    if d is None or not math.isfinite(d):  # a reference that is NaN or inf compares with nothing
        return Status.NO_FIGURE, None
    if tolerance is None:
        return Status.NOT_GATED, d
    worse_by = abs(d) if worse == "either" else d if worse == "higher" else -d
    if worse_by > tolerance:
        return Status.FAIL, d
    if worse != "either" and worse_by < -tolerance:
        return Status.BETTER, d
    return (Status.CHANGED if report_change and d else Status.OK), d


def is_number(value: object) -> bool:
    """A figure as JSON or Python holds one: an int or a float, NaN and inf included (a diverged run's loss is data);
    text, null or a boolean is not."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def non_finite(value: float | None) -> str | None:
    """'NaN' or 'inf' for a figure that is not a finite number (None for a finite one or no figure)."""
    if value is None or math.isfinite(value):
        return None
    return "NaN" if math.isnan(value) else f"{value:+}"


def delta_text(d: float | None, status: str | None = None) -> str:
    """A relative delta as a table cell: '+3.1%', '(+3.1%)' where the metric is not gated, '—' without one."""
    if d is None:
        return "—"
    return f"({d:+.1%})" if status == Status.NOT_GATED else f"{d:+.1%}"
