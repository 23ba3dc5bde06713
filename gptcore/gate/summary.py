"""The gate's end-of-run rendering: the end table (:func:`gate_table`), the "does it still learn" table
(:func:`convergence_table`), the "does each optimization still pay" table (:func:`expectations_table`) and the same
verdict as markdown (:func:`gate_markdown`). Text only: what is judged is decided in :mod:`gptcore.gate.session`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from gptcore.gate.checks import compared_peaks
from gptcore.gate.operators import TORCH_LINE
from gptcore.gate.rules import Status, delta, delta_text
from gptcore.gate.verdicts import GPU_BUSY
from gptcore.units import common_unit, format_bytes

if TYPE_CHECKING:
    from gptcore.gate.expectations import EffectResult
    from gptcore.gate.session import Gate, Row

__all__ = [
    "CONVERGENCE",
    "PAYS",
    "convergence_table",
    "expectations_table",
    "gate_markdown",
    "gate_table",
    "md_escape",
]

CONVERGENCE = "does it still learn (convergence runs: validation loss and time-to-loss)"
PAYS = "does each optimization still pay (expected effects, judged within this run)"


def end_lines(gate: Gate, notes: Sequence[str]) -> list[str]:
    """The end-of-run section's lines: the end table, the convergence runs, the expected effects, the notes."""
    lines = [gate_table(gate.rows)] if gate.rows else []
    if any(r.measured and r.measured.convergence for r in gate.rows):
        lines += [f"{CONVERGENCE}:", convergence_table(gate.rows)]
    if gate.expected.outcomes:
        lines += [f"{PAYS}:", expectations_table(gate.expected.outcomes)]
    return lines + list(notes)


def gate_markdown(gate: Gate, notes: Sequence[str], history: str = "") -> str:
    """The verdict as GitHub-flavoured markdown: the torch versions where the baselines' differ from the run's; the
    failing cases, one line each; then the table; then the expected effects; then ``history`` (the change points in
    the saved runs, gptcore.hunt.history.markdown); then the notes."""
    failures = gate.failures + [line.removeprefix("FAIL: ") for line in gate.regressions]
    verdict = f"FAIL: {len(failures)} failure(s)" if failures else "ok"
    out = [f"## gptcore benchmark gate: {verdict} ({len(gate.rows)} case{'s' if len(gate.rows) != 1 else ''})", ""]
    torch = next((n for n in notes if n.startswith(TORCH_LINE)), None)  # at the top, not folded away with the notes
    out += [md_escape(torch), ""] if torch else []
    if failures:
        out += ["### Failing", "", *(f"- {md_escape(line)}" for line in failures), ""]
    out += ["### Cases", "", gate_table(gate.rows, tablefmt="github"), ""]
    if any(r.measured and r.measured.convergence for r in gate.rows):
        out += [f"### {CONVERGENCE[0].upper()}{CONVERGENCE[1:]}", "", convergence_table(gate.rows, "github"), ""]
    if gate.expected.outcomes:
        out += [f"### {PAYS[0].upper()}{PAYS[1:]}", "", expectations_table(gate.expected.outcomes, "github"), ""]
    if history:
        out.append(history)
    rest = [n for n in notes if not n.startswith("FAIL") and n != torch]
    if rest:
        out += ["<details><summary>notes</summary>", "", *(f"- {md_escape(n)}" for n in rest), "", "</details>", ""]
    return "\n".join(out) + "\n"


def md_escape(text: str) -> str:
    """Text safe in a markdown list item or table cell ([, ], | and * are markdown): the gate's verdict and
    history's section (gptcore.hunt.findings) escape alike."""
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("*", "\\*")


def _pct(measured: float | None, baseline: float | None, status: str | None = None) -> str:
    """A delta cell: none where the gate found the figures not comparable (Status.NO_FIGURE)."""
    if status == Status.NO_FIGURE:
        return "—"
    return delta_text(delta(measured, baseline, relative=True), status)


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:,.2f}"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def gate_table(rows: Sequence[Row], tablefmt: str = "simple") -> str:
    """One line per case: tokens/s and peak memory measured / baseline / delta (in parentheses when not gated),
    the estimate over the measured peak, MFU and the source of its FLOPs, the loss and its drift, what moved in the
    work ledger, and the verdict. Both memory columns share one unit. Where a case has a GPU busy time, its three
    columns (ms per step, baseline, delta) follow tokens/s; a run without one (CPU) has none."""
    peaks = [
        (
            r.measured.peak_allocated_bytes if r.measured else None,
            r.baseline.peak_allocated_bytes if r.baseline else None,
        )
        for r in rows
    ]
    unit = common_unit(b for pair in peaks for b in pair)
    busy = [tuple(e.gpu_busy_seconds if e else None for e in (r.measured, r.baseline)) for r in rows]
    shown = any(b is not None for pair in busy for b in pair)  # GPU busy columns only where there is such a figure
    table = []
    for row, (peak, base_peak), (ms, base_ms) in zip(rows, peaks, busy):
        m, b = row.measured, row.baseline
        est = row.estimate
        est_meas = f"{est / peak:.2f}" if isinstance(est, (int, float)) and peak else ("err" if est == "err" else "—")
        reference = b.loss_reference(m.cpu_model)[0] if m and b else None
        loss = m.loss if m else None
        if m and m.convergence:  # a whole training run: its final validation loss
            loss = m.convergence.final_val_loss
            reference = b.convergence.final_val_loss if b and b.convergence else None
            loss_delta = "—" if reference is None else f"{loss - reference:+.4f}"
        elif not (m and b and m.loss is not None and reference is not None):
            loss_delta = "—"
        elif m.loss_step != b.loss_step:
            loss_delta = f"(step {m.loss_step}≠{b.loss_step})"
        else:
            loss_delta = f"{m.loss - reference:+.1e}"
        table.append(
            [
                row.case,
                _num(m.tokens_per_s if m else None, ",.0f"),
                _num(b.tokens_per_s if b else None, ",.0f"),
                _pct(m.tokens_per_s if m else None, b.tokens_per_s if b else None, row.status.get("tokens/s")),
                *([_ms(ms), _ms(base_ms), _pct(ms, base_ms, row.status.get(GPU_BUSY))] if shown else []),
                format_bytes(peak, unit),
                format_bytes(base_peak, unit),
                _pct(*(compared_peaks(m, b) if m and b else (peak, base_peak)), row.status.get("peak memory")),
                est_meas,
                row.mfu,
                ("val " if m and m.convergence else "") + _num(loss, ".4f"),
                loss_delta,
                row.work,
                row.verdict if not row.error else f"{row.verdict} ({row.error})",
            ]
        )
    headers = [
        "case",
        "tok/s",
        "base tok/s",
        "Δ",
        *(["GPU busy ms", "base ms", "Δ"] if shown else []),
        "peak",
        "base peak",
        "Δ",
        "est/meas",
        "MFU",
        "loss",
        "Δ loss",
        "work",
        "verdict",
    ]
    return _tabulated(table, headers, tablefmt)


def convergence_table(rows: Sequence[Row], tablefmt: str = "simple") -> str:
    """The convergence cases: validation loss at the start, the middle and the end (baseline's end beside it),
    time-to-loss now and in the baseline (steps, tokens, training seconds), training tokens/s."""
    table = []
    for row in rows:
        m, b = row.measured, row.baseline
        now, before = (m.convergence if m else None), (b.convergence if b else None)
        if now is None:
            continue
        mid = len(now.steps) // 2
        reached = now.time_to_loss()
        was = before.time_to_loss(now.target_loss) if before else None
        table.append(
            [
                row.case,
                f"{now.val_loss[0]:.3f}",
                f"{now.val_loss[mid]:.3f} @{now.steps[mid]}",
                f"{now.final_val_loss:.4f} @{now.steps[-1]}",
                _num(before.final_val_loss if before else None, ".4f"),
                _num(now.target_loss, "g"),
                "never" if reached is None else f"{reached[0]:,} ({reached[1]:,} tok, {reached[2]:.0f} s)",
                "—" if before is None else "never" if was is None else f"{was[0]:,}",
                _num(now.tokens_per_s, ",.0f"),
                row.verdict,
            ]
        )
    headers = [
        "case",
        "val @0",
        "val mid",
        "val end",
        "base end",
        "target",
        "time-to-loss (steps)",
        "base steps",
        "tok/s",
        "verdict",
    ]
    return _tabulated(table, headers, tablefmt)


def expectations_table(outcomes: Sequence[EffectResult], tablefmt: str = "simple") -> str:
    """One line per expectation judged: the model, the claim, the case against its reference, the bound (with the
    estimate's prediction for memory) and the status."""
    rows = [[o.model, o.claim, o.measured, o.expected, o.status] for o in outcomes]
    return _tabulated(rows, ["model", "expected effect", "measured", "bound", "status"], tablefmt, stralign="left")


def _tabulated(table: list[list[str]], headers: list[str], tablefmt: str, stralign: str = "right") -> str:
    """A table of text cells, as written (no number parsing), in ``tablefmt``: "github" escapes each cell's
    markdown."""
    if tablefmt == "github":
        table = [[md_escape(cell) for cell in line] for line in table]
    return tabulate(table, headers=headers, disable_numparse=True, stralign=stralign, tablefmt=tablefmt)
