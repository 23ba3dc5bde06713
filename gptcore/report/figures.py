"""The HTML report's figures, each a matplotlib PNG as base64: each case now against its baseline with the gate's
tolerance band, the estimate's memory breakdown, the ladder's waterfall, the saved runs' history with its change
points, and the convergence runs' validation loss."""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gptcore.gate.baselines import BaselineFile
from gptcore.gate.checks import Check, memory_check, speed_check, speed_incomparable
from gptcore.gate.rules import Status, percent
from gptcore.gate.schema import Entry, Tolerances
from gptcore.hunt.findings import Finding
from gptcore.measure.convergence import Convergence
from gptcore.memory import CATEGORIES, estimate, resolve
from gptcore.presets import RECIPE_NOTES, get_model, get_recipe
from gptcore.report.tables import Record, number
from gptcore.units import common_unit, in_unit


@dataclass
class SavedRun:
    """One saved pytest-benchmark run: its number, commit and per-case figures (tokens/s, IQR, peak bytes, busy)."""

    number: str
    commit: str
    time: str
    cases: dict[str, tuple[float | None, float | None, float | None, bool]]

    @property
    def label(self) -> str:
        return f"{self.number}\n{self.commit[:7] or '?'}\n{self.time[:10]}"


LADDER_RUNG = re.compile(r"^ladder-(\d+)$")
COLORS = {"now": "#1f77b4", "fail": "#d62728", "better": "#2ca02c", "base": "#9e9e9e", "band": "#2ca02c"}


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _thousands(x: float, _: int) -> str:
    """An axis formatter: 120,000 rather than 120000."""
    return f"{x:,.0f}"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def case_checks(r: Record, e: Entry | None, tol: Tolerances) -> tuple[Check, Check]:
    """The case's tokens/s and peak memory checks, made by the gate's own rules (``checks.speed_check`` and
    ``memory_check``), so that the page cannot disagree with the gate; 'no baseline' without an entry."""
    if e is None:
        return (
            Check("tokens/s", r.values["speed"], None, None, Status.NO_BASELINE),
            Check("peak memory", number(r.info.get("peak_allocated_bytes")), None, None, Status.NO_BASELINE),
        )
    incomparable = speed_incomparable(r.info.get("cpu_model"), e) if "cpu_model" in r.info else None
    return (
        speed_check(r.values["speed"], e.tokens_per_s, tol, incomparable=incomparable),
        memory_check(number(r.info.get("peak_allocated_bytes")), e.peak_allocated_bytes, tol),
    )


def now_vs_baseline_figure(group: str, recs: Sequence[Record], base: BaselineFile | None, tol: Tolerances) -> str:
    """tokens/s (IQR error bars) and peak memory, now against baseline, with the tolerance bands; one row a case.
    A group is one study's benchmark: its own tolerances in the file, where it has them, over ``tol``."""
    if base is not None and recs:
        tol = base.tolerances_for(recs[0].name)
    plt = _pyplot()
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    n = len(recs)
    fig, (ax_s, ax_m) = plt.subplots(1, 2, figsize=(13, 1.4 + 0.42 * n), sharey=True)
    entries = [base.entries.get(r.name) if base else None for r in recs]
    unit = common_unit(
        [number(r.info.get("peak_allocated_bytes")) for r in recs] + [e.peak_allocated_bytes for e in entries if e]
    )
    for i, (r, e) in enumerate(zip(recs, entries)):
        y = n - 1 - i
        now_s, base_s = r.values["speed"], e.tokens_per_s if e else None
        speed, memory = case_checks(r, e, tol)
        status = speed.status
        if base_s is not None:
            if tol.speed is not None:
                ax_s.fill_betweenx(
                    [y - 0.42, y + 0.42],
                    base_s * (1 - tol.speed),
                    base_s * (1 + tol.speed),
                    color=COLORS["band"],
                    alpha=0.18,
                    lw=0,
                )
            ax_s.barh(y + 0.19, base_s, 0.36, color=COLORS["base"], xerr=(e.tokens_per_s_iqr or 0) / 2, capsize=2)
        if now_s is not None and math.isfinite(now_s):  # a NaN or inf speed is named in the table, not drawn
            ax_s.barh(
                y - 0.19,
                now_s,
                0.36,
                color=COLORS["fail" if status == Status.FAIL else "now"],
                xerr=(r.speed_iqr or 0) / 2,
                capsize=2,
                hatch="//" if r.busy else None,
                edgecolor="black",
            )
            if r.busy:
                ax_s.text(
                    now_s,
                    y - 0.19,
                    f"  busy (cpu_share {r.info.get('cpu_share'):.2f})",
                    va="center",
                    fontsize=7,
                    color=COLORS["fail"],
                )
        now_m = number(r.info.get("peak_allocated_bytes"))
        base_m = e.peak_allocated_bytes if e else None
        status = memory.status
        if base_m is not None:
            b = in_unit(base_m, unit)
            ax_m.fill_betweenx(
                [y - 0.42, y + 0.42], b * (1 - tol.memory), b * (1 + tol.memory), color=COLORS["band"], alpha=0.18, lw=0
            )
            ax_m.barh(y + 0.19, b, 0.36, color=COLORS["base"])
        if now_m is not None:
            ax_m.barh(y - 0.19, in_unit(now_m, unit), 0.36, color=COLORS.get(status.lower(), COLORS["now"]))
        else:
            ax_m.text(0, y, "  no figure (compiled: not tracked on CPU)", va="center", fontsize=7)
    ax_s.set_yticks(range(n), [r.name for r in reversed(recs)], fontsize=8)
    gated = "not gated: reported only" if tol.speed is None else f"gated: fails below −{percent(tol.speed)}"
    ax_s.set_title(
        f"{group}: tokens/s, now vs baseline\n({gated})",
        fontsize=10,
        color=COLORS["fail"] if tol.speed is None else "black",
    )
    ax_s.set_xlabel("tokens/s (median over rounds; error bars: IQR over rounds)")
    ax_m.set_title(f"{group}: peak memory, now vs baseline\n(gated: fails above +{percent(tol.memory)})", fontsize=10)
    ax_m.set_xlabel(f"peak allocated memory ({unit})")
    ax_s.set_ylabel("case")
    ax_m.set_ylabel("case")
    ax_s.xaxis.set_major_formatter(_thousands)
    ax_s.xaxis.set_major_locator(MaxNLocator(5))
    handles = [
        Patch(color=COLORS["now"], label="now"),
        Patch(color=COLORS["base"], label="baseline"),
        Patch(color=COLORS["band"], alpha=0.3, label="tolerance band"),
        Patch(color=COLORS["fail"], label="FAIL"),
        Patch(facecolor="white", hatch="//", label="busy CPU"),
    ]
    ax_m.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def estimate_at_peak(r: Record) -> tuple[dict[str, int], str] | str:
    """The analytic estimate at the peak for a case: (bytes per category, phase), or why there is none."""
    try:
        cfg = get_model(r.model)
        device = "cuda" if str(r.info.get("device", "cpu")).startswith("cuda") else "cpu"
        est = estimate(resolve(cfg, get_recipe(r.recipe), batch=cfg.batch_size, seq=cfg.block_size, device=device))
    except ValueError as err:
        return str(err)
    return est.by_category, est.phase


def breakdown_figure(group: str, recs: Sequence[Record]) -> str | None:
    """Stacked bars of the estimate's categories at the peak, one per case, with the measured peak marked."""
    found = [(r, b) for r in recs for b in [estimate_at_peak(r)] if not isinstance(b, str)]
    if not found:
        return None
    plt = _pyplot()
    unit = common_unit(sum(b[0].values()) for _, b in found)
    colors = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(13, 1.6 + 0.38 * len(found)))
    for i, (r, (cats, _)) in enumerate(found):
        y, left = len(found) - 1 - i, 0.0
        for k, category in enumerate(CATEGORIES):
            width = in_unit(cats.get(category, 0), unit)
            ax.barh(y, width, 0.7, left=left, color=colors[k % len(colors)], label=category if i == 0 else None)
            left += width
        measured = number(r.info.get("peak_allocated_bytes"))
        if measured is not None:
            ax.plot(in_unit(measured, unit), y, "kD", ms=5, label="measured peak" if i == 0 else None)
    ax.set_yticks(range(len(found)), [f"{r.model} / {r.recipe} ({b[1]})" for r, b in reversed(found)], fontsize=8)
    ax.set_xlabel(f"live memory at the estimated peak ({unit})")
    ax.set_ylabel("model / recipe (phase of the peak)")
    ax.set_title(f"{group}: where the memory goes (analytic estimate, by category)", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def ladders(recs: Sequence[Record]) -> dict[str, list[tuple[int, Record]]]:
    """Ladder cases by model, in rung order; only models with two rungs or more."""
    out: dict[str, list[tuple[int, Record]]] = {}
    for r in recs:
        match = LADDER_RUNG.match(r.recipe)
        if match and r.values["speed"] is not None:
            out.setdefault(r.model, []).append((int(match.group(1)), r))
    return {m: sorted(rungs, key=lambda x: x[0]) for m, rungs in out.items() if len(rungs) > 1}


def waterfall_figure(model: str, rungs: Sequence[tuple[int, Record]], base: BaselineFile | None) -> str:
    """tokens/s rung by rung: the first bar whole, each next one the change it brought (IQR error bars)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(rungs) + 2), 4.8))
    previous = None
    for x, (_rung, r) in enumerate(rungs):
        value = r.values["speed"]
        if previous is None:
            ax.bar(x, value, 0.6, color=COLORS["base"])
        else:
            ax.bar(
                x,
                abs(value - previous),
                0.6,
                bottom=min(value, previous),
                color=COLORS["better"] if value >= previous else COLORS["fail"],
            )
            ax.plot([x - 1.3, x - 0.3], [previous, previous], color="black", lw=0.6, ls=":")
            ax.text(x, max(value, previous), f"{value / previous - 1:+.0%}", ha="center", va="bottom", fontsize=8)
        ax.errorbar(x, value, yerr=(r.speed_iqr or 0) / 2, color="black", capsize=3, lw=1)
        entry = base.entries.get(r.name) if base else None
        if entry and entry.tokens_per_s is not None:
            ax.plot(
                x,
                entry.tokens_per_s,
                "k_",
                ms=16,
                mew=2,
                label="baseline" if "baseline" not in ax.get_legend_handles_labels()[1] else None,
            )
        previous = value
    labels = [RECIPE_NOTES.get(r.recipe, r.recipe).replace("ladder rung ", "").replace(": ", "\n") for _, r in rungs]
    ax.set_xticks(range(len(rungs)), labels, fontsize=8)
    ax.set_xlabel("ladder rung (the switch it adds)")
    ax.set_ylabel("tokens/s (median over rounds)")
    ax.yaxis.set_major_formatter(_thousands)
    ax.set_title(f"ladder, {model}: tokens/s rung by rung (green: faster, red: slower; error bars: IQR)", fontsize=10)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8)
    return _png(fig)


def history_figure(
    group: str, recs: Sequence[Record], runs: Sequence[SavedRun], changes: Sequence[Finding] = ()
) -> str | None:
    """tokens/s (IQR error bars) and peak memory per case over the saved runs, oldest commit first; each change
    point or creep of ``changes`` (gptcore.hunt.history) marked as a shaded commit range on its metric's plot."""
    names = [r.name for r in recs if any(r.name in run.cases for run in runs)]
    if not names:
        return None
    plt = _pyplot()
    unit = common_unit(run.cases[n][2] for run in runs for n in names if n in run.cases)
    fig, (ax_s, ax_m) = plt.subplots(1, 2, figsize=(14, 5.2))
    xs = range(len(runs))
    for name in names:
        points = [run.cases.get(name, (None, None, None, False)) for run in runs]
        speed = [p[0] if p[0] is not None else math.nan for p in points]
        line = ax_s.errorbar(xs, speed, yerr=[(p[1] or 0) / 2 for p in points], marker="o", ms=4, capsize=2, label=name)
        busy = [(x, p[0]) for x, p in zip(xs, points) if p[3] and p[0] is not None]
        if busy:
            ax_s.plot(*zip(*busy), "x", color=COLORS["fail"], ms=9, mew=2)
        ax_m.plot(
            xs,
            [in_unit(p[2], unit) if p[2] is not None else math.nan for p in points],
            marker="o",
            ms=4,
            color=line[0].get_color(),
            label=name,
        )
    for ax in (ax_s, ax_m):
        ax.set_xticks(list(xs), [run.label for run in runs], fontsize=7)
        ax.set_xlabel("saved run (number, commit, date)")
    for change in changes:
        if change.case not in names or change.metric not in ("tokens/s", "peak memory"):
            continue
        at = [i for i, run in enumerate(runs) if run.commit in (change.before, change.after)]
        if at:
            ax = ax_s if change.metric == "tokens/s" else ax_m
            span = f"{change.status} {change.before[:7]}..{change.after[:7]}"
            ax.axvspan(min(at) - 0.1, max(at) + 0.1, color=COLORS["fail"], alpha=0.15, label=f"_change {span}")
            ax.text(max(at), ax.get_ylim()[1], f" {span}", fontsize=7, va="top", color=COLORS["fail"])
    ax_s.set_ylabel("tokens/s (median; error bars: IQR)")
    ax_s.yaxis.set_major_formatter(_thousands)
    ax_m.set_ylabel(f"peak allocated memory ({unit})")
    ax_s.set_title(f"{group}: tokens/s over commits (red x: busy CPU)", fontsize=10)
    ax_m.set_title(f"{group}: peak memory over commits", fontsize=10)
    ax_m.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def convergence_figure(group: str, recs: Sequence[Record], base: BaselineFile | None) -> str | None:
    """Validation loss over training steps for the group's convergence cases: now (solid) and the baseline's run
    (dashed, same colour), with the time-to-loss target; None when no case of the group is a convergence run."""
    runs = []
    for r in recs:
        try:
            runs.append((r, Convergence.from_json(r.info.get("convergence"), r.name)))
        except ValueError:
            continue
    if not runs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 5.5))
    cmap = plt.get_cmap("tab20")
    for i, (r, run) in enumerate(runs):
        color = cmap(i % 20)
        ax.plot(run.steps[1:], run.val_loss[1:], color=color, lw=1.4, label=r.name)
        e = base.entries.get(r.name) if base else None
        if e is not None and e.convergence is not None:
            ax.plot(e.convergence.steps[1:], e.convergence.val_loss[1:], color=color, lw=1, ls="--")
    targets = {run.target_loss for _, run in runs if run.target_loss is not None}
    for target in targets:
        ax.axhline(target, color="black", lw=0.8, ls=":")
        ax.text(ax.get_xlim()[1], target, f" target {target:g}", va="center", fontsize=8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats/token, fixed batches)")
    ax.set_title(f"{group}: validation loss, now (solid) vs baseline (dashed)", fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    return _png(fig)
