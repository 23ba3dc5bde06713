"""What ``history`` finds and how it is written: a change point or creeping stretch of one case's metric
(``Finding``, with the command that hunts it), the whole analysis (``History``), and the markdown section of the
gate's verdict ("Change points in history")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from gptcore.gate.rules import non_finite
from gptcore.gate.summary import md_escape
from gptcore.hunt.changepoints import MIN_STEP

WORSE = {"tokens/s": "lower"}
"""The direction that is worse, where it is not higher (a loss at a fixed step is news either way)."""
BISECT = {"tokens/s": "tokens_per_s", "peak memory": "peak_memory", "loss": "loss"}
"""bisect --metric for each metric it can hunt (bisection.METRICS); work counts are hunted with compare."""
UNHUNTED = ("val loss",)
"""Metrics neither bisect nor compare measures (a convergence run's final validation loss)."""


@dataclass
class Point:
    commit: str
    time: str
    value: float
    env: dict = field(default_factory=dict)
    """What else could move a figure between runs: torch's version, the CPU model, the case's setup (its model and
    recipe as flat fields, gptcore.config.fields)."""


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
    """(last commit before, last commit) that the hunt covers where the place of a step or a creep is uncertain
    (``gptcore.hunt.history``): its (before, after] is then a best guess."""

    @property
    def uncertain(self) -> bool:
        """The finding's place (a step's or a creep's) is uncertain: its hunt covers a wider range than
        (before, after], and its note says so."""
        return self.hunt is not None

    def size(self) -> str:
        """The change as text: '+8,915,712 (+43.2%)', '-0.111657 (-3.0%)'; 'NaN' or 'inf' where it became that."""
        if not math.isfinite(self.change):
            return non_finite(self.change) or ""
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
                f"| {md_escape(f.case)} | {f.metric} | {f.size()} | {f.before[:7]}..{f.after[:7]} | "
                f"{'exact' if f.p is None else f'p {f.p:.1e}'} | {f.status} ({md_escape(f.note)}) |"
            )
        hunts = list(dict.fromkeys(f.command() for f in history.findings if f.command()))
        if hunts:
            out += ["", "Hunt each one:", "", "```bash", *hunts, "```"]
    if history.skipped:
        out += [
            "",
            f"<details><summary>left out ({len(history.skipped)})</summary>",
            "",
            *(f"- {md_escape(line)}" for line in history.skipped),
            "",
            "</details>",
        ]
    return "\n".join(out + [""])
