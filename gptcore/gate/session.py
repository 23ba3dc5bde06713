"""The benchmark gate's state and judgment for one pytest session: :class:`Gate` holds the baseline files per
device, judges each case against its baseline (:meth:`Gate.judge`, :meth:`Gate.judge_convergence`), keeps one
:class:`Row` per case for the end table, and records cases as they end (:meth:`Gate.write_updates`). The pytest
wiring is in :mod:`gptcore.plugin`, the end-of-run rendering in :mod:`gptcore.gate.summary`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gptcore import identity
from gptcore.gate import baselines, checks, expectations, operators, rules, verdicts
from gptcore.gate.baselines import BaselineFile
from gptcore.gate.expectations import Figures
from gptcore.gate.results import ROW_CELLS
from gptcore.gate.schema import BaselineError, Entry, Tolerances
from gptcore.gate.verdicts import Verdict

if TYPE_CHECKING:
    from gptcore.gate.results import Record, ResultsLog
    from gptcore.measure.convergence import Convergence
    from gptcore.measure.measurement import Measurement

__all__ = ["Gate", "Outcome", "Row"]

LEFTOVER_SHARE = 0.01
"""Above this share of a GPU case's peak, what was allocated before it began is named under the end table: on an
H200 an earlier case's 20,585,324,544 B made a 22.5 GB peak read 43.0 GB."""


@dataclass
class Row:
    """One case of the end table."""

    case: str
    measured: Entry | None
    baseline: Entry | None
    verdict: str
    estimate: int | str | None = None
    error: str | None = None
    status: dict[str, str] = field(default_factory=dict)
    """metric -> status of its check (ok, FAIL, better, not gated, no baseline)."""
    work: str = "—"
    """The work ledger against its baseline: '=' when every count is the same, else the counts that moved."""
    mfu: str = "—"
    """MFU and where its FLOPs come from ('analytic' 6N + attention, or 'counted' by the work ledger)."""

    def cells(self) -> dict:
        """What the end table shows of the case beside its figures (kept in the results log)."""
        return {name: getattr(self, name) for name in ROW_CELLS}


@dataclass
class Outcome:
    """What the gate concluded of one case: the verdict against its baseline (None when it was recorded or it
    failed to run), the failure lines (an error, failed checks, unmet expected effects, a missing baseline under
    --baseline-strict) and, when it has no baseline, the line that says how to record it."""

    verdict: Verdict | None
    failures: list[str] = field(default_factory=list)
    missing: str | None = None


@dataclass
class Gate:
    """Session state of the baselines gate: the files per device, what ran, what to record."""

    directory: Path
    update: bool
    strict: bool
    overrides: dict[str, float]
    timing_override: tuple[int | None, int | None, int | None]
    root: Path = Path(".")
    """Where the git commit recorded with the baselines is read."""
    notes: list[str] = field(default_factory=list)
    files: dict[str, BaselineFile | None] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    pending: dict[str, dict[str, Entry]] = field(default_factory=dict)
    update_loss: bool = False
    """--update-loss-references: add this CPU model's losses to the recorded entries, and nothing else."""
    loss_references: dict[str, int] = field(default_factory=dict)
    """The CPU model whose loss each gated case was held to, and how many cases (said under the table)."""
    kernel_peaks: dict[str, int] = field(default_factory=dict)
    """Half-precision cases whose entry another CPU model recorded, by that model (``checks.other_kernels``)."""
    missing: list[str] = field(default_factory=list)
    not_gated: dict[str, int] = field(default_factory=dict)
    regressions: list[str] = field(default_factory=list)
    """One line per case that pytest-benchmark's --benchmark-compare-fail failed."""
    failures: list[str] = field(default_factory=list)
    """The one-line failure of each case that failed (a check, an unmet expectation, an error), in run order."""
    markdown: Path | None = None
    """--gate-markdown: where to write the verdict as markdown."""
    cpu_model: str = field(default_factory=identity.cpu_model)
    history_note: str | None = None
    """Where pytest-benchmark's history of this device is, when the gate split its storage (shown when cases ran)."""
    expected: expectations.Session = field(default_factory=expectations.Session)
    """Each optimization's declared effect, judged within the run (gptcore.gate.expectations)."""
    log: ResultsLog | None = None
    """--results-log: one line per case, written as the case ends (gptcore.gate.results)."""
    cases: dict[str, dict] = field(default_factory=dict)
    """What judging each case leaves for its results-log line: nodeid -> slug, verdict, failures, entry, row."""
    recorded: dict[Path, list[int]] = field(default_factory=dict)
    """Per baseline file: the cases written into it, each as it ended, and those --update-loss-references skipped."""
    resumed: list[str] = field(default_factory=list)
    """--resume: the cases a log had finished, shown from it and not run again (gptcore.plugin)."""
    resumed_failed: bool = False
    log_lost: bool = False  # the results log could not be written mid-run: the cases went on; the run fails
    cpu_speed: bool = False
    """--cpu-speed: time a CPU study's full ``speed_rounds`` (the default times only what the exact checks need)."""
    cpu_threads: int | None = None  # --bench-threads: every CPU case's intra-op threads, over its study's
    leaner: list[str] = field(default_factory=list)
    """--baseline-strict: the cases whose exact counts went down (their baseline is stale)."""
    not_started: list[str] = field(default_factory=list)
    """--deadline: the cases not started because they would likely have ended after it."""
    torches: dict[tuple[str, str], int] = field(default_factory=dict)
    """(the baselines' torch, this run's) -> the cases judged across them, where the two differ."""

    def timing(self, warmup: int, rounds: int, steps: int) -> tuple[int, int, int]:
        """The case's (warm-up, rounds, steps per round), with the command-line overrides applied."""
        return tuple(given if o is None else o for given, o in zip((warmup, rounds, steps), self.timing_override))

    def path_for(self, slug: str) -> Path:
        return self.directory / f"{slug}.json"

    def load(self, slug: str) -> BaselineFile | None:  # the device's baseline file (cached); BaselineError if bad
        if slug not in self.files:
            self.files[slug] = baselines.load(self.path_for(slug), expect_slug=slug)
        return self.files[slug]

    def tolerances(self, file: BaselineFile | None, device_type: str, case: str) -> Tolerances:
        """The tolerances ``case`` is judged with: its study's in the file, else the file's, else the device type's
        defaults; the command line's (--speed-tol ...) over them."""
        base = file.tolerances_for(case) if file else Tolerances.default_for(device_type)
        return dataclasses.replace(base, **self.overrides)

    @staticmethod
    def record_command(*nodeids: str) -> str:  # the command that records these cases into their baseline files
        return "python -m pytest " + " ".join(f'"{n}"' for n in nodeids) + " --update-baselines"

    def summary_notes(self) -> list[str]:
        """The lines under the end table: torch where it differs, setup notes, what was not gated, what to record."""
        notes = [line for line in [operators.torch_line(self.torches)] if line] + list(self.notes)
        for path, (n, skipped) in self.recorded.items():
            notes.append(
                f"baselines: added {n} loss reference(s) of {self.cpu_model} to {path}"
                + (f"; skipped {skipped} (no entry, or a loss read at another step)" if skipped else "")
                if self.update_loss
                else f"baselines: recorded {n} case(s) into {path}, each as it ended"
            )
        if self.leaner:
            notes.append(
                f"{len(self.leaner)} case(s) leaner than the baseline; refresh exactly those with: "
                f"{self.record_command(*self.leaner)}"
            )
        if self.resumed:
            notes.append(
                f"resumed: {len(self.resumed)} case(s) finished in {self.log.path if self.log else 'the log'} "
                f"shown from it, not run again"
            )
        if self.not_started:
            notes.append(f"deadline: {len(self.not_started)} case(s) not started: {', '.join(self.not_started)}")
        if self.log and (self.rows or self.not_started):
            notes.append(f"results log: {self.log.path} (--resume {self.log.path} runs what it has not finished)")
        notes += [
            f"{reason} ({n} case{'s' if n > 1 else ''}; shown in parentheses)" for reason, n in self.not_gated.items()
        ]
        if self.missing:
            targets = (
                self.missing if len(self.missing) <= 3 else list(dict.fromkeys(n.split("::")[0] for n in self.missing))
            )  # many: whole files (only the cases that run are written)
            notes.append(
                f"{len(self.missing)} case(s) have no baseline; record them with: {self.record_command(*targets)}"
            )
        unchecked = self.expected.unchecked()
        if unchecked:
            notes.append(f"expectations not checked, their reference did not run (-k?): {', '.join(unchecked)}")
        for model, n in self.loss_references.items():
            notes.append(f"loss held to the reference of {model} ({n} case{'s' if n > 1 else ''})")
        notes += [checks.kernel_note(model, n) for model, n in self.kernel_peaks.items()]
        if self.history_note and self.rows:
            notes.append(self.history_note)
        return notes + self.regressions

    def judge(
        self,
        node: pytest.Item,
        m: Measurement,
        *,
        model: str,
        recipe: str,
        precision: str,
        estimate: int | str | None,
        estimate_by_category: dict[str, int] | None = None,
        world: int = 1,
    ) -> Outcome:
        """The one hand-over of a benchmark case: its Measurement against the baseline (a row of the end table, or
        recorded under --update-baselines), then the expected effects it completes. ``estimate_by_category``: the
        estimate's peak by category, kept to say where a memory change is."""
        measured = Entry.from_measurement(
            m, precision=precision, cpu_model=self.cpu_model, estimate_by_category=estimate_by_category
        )
        measured.torch = identity.torch_version()
        error = m.error or _not_finite(measured)  # a NaN or inf is never recorded, nor compared
        verdict = self.judge_entry(
            node, measured, m.device, estimate=estimate, error=error, mfu=_mfu_cell(m), unfit=m.unfit
        )
        if left_out := m.left_out():  # said under the end table: which rounds the median left out, and why
            self.notes.append(f"{node.name}: {left_out}")
        if m.round_clocks:  # and each round's clocks in the results log, where a flag's why can be read again
            self.cases[node.nodeid]["round_clocks"] = m.round_clocks
        left = m.allocated_before or 0
        if m.peak_allocated_bytes and left > LEFTOVER_SHARE * m.peak_allocated_bytes:
            self.notes.append(
                f"{node.name}: {left:,} B were still allocated when it began, left by a case before it: its peak "
                "includes them"
            )
        figures = Figures.of(measured, estimate, m.tokens_per_step)
        unmet = [] if error else self._expect(model, recipe, m.device, figures, world)
        if not error:  # what the expected effects judged, kept for a merge of shards to judge them again
            self.cases[node.nodeid]["effect"] = {
                "model": model,
                "recipe": recipe,
                "device": m.device.split(":")[0],
                "world": world,
                "figures": list(dataclasses.astuple(figures)),
            }
        return self._outcome(node, m.device, error, verdict, unmet)

    def judge_convergence(
        self, node: pytest.Item, run: Convergence | None, *, device: str, precision: str, error: str | None = None
    ) -> Outcome:
        """The hand-over of a convergence case (gptcore.measure.convergence); ``run`` is None when it failed with
        ``error``."""
        measured = Entry.from_convergence(run, device=device, precision=precision, cpu_model=self.cpu_model)
        return self._outcome(node, device, error, self.judge_entry(node, measured, device, error=error), [])

    def _outcome(
        self, node: pytest.Item, device: str, error: str | None, verdict: Verdict | None, unmet: list[str]
    ) -> Outcome:
        failures = [f"{node.name}: {error}"] if error else []
        failures += [verdict.failure_message()] if verdict is not None and verdict.failed else []
        failures += [f"{node.name}: expected effect not met: {line}" for line in unmet]
        if self.pending:  # recorded now, so that a run killed later keeps this case
            try:
                self.write_updates()
            except (BaselineError, OSError) as err:
                failures.append(f"{node.name}: baselines: NOT written: {err}")
        missing = None
        if not failures and verdict is not None and verdict.missing:
            missing = (
                f"{node.name}: no baseline for {identity.device_slug(device)}{verdict.missing_why}; record it with: "
                f"{self.record_command(node.nodeid)}"
            )
            if self.strict:
                failures.append(missing + " (--baseline-strict)")
        self.failures += failures
        self.cases.setdefault(node.nodeid, {})["failures"] = failures
        return Outcome(verdict, failures, missing)

    def judge_entry(
        self,
        node: pytest.Item,
        measured: Entry,
        device: str,
        *,
        estimate: int | str | None = None,
        error: str | None = None,
        mfu: str = "—",
        unfit: str | None = None,
    ) -> Verdict | None:
        """Record (under --update-baselines) or judge ``measured`` against the device's baseline, and keep a row."""
        device_type = device.split(":")[0]
        slug = identity.device_slug(device)
        file = self.load(slug)
        baseline = file.entry(node.name) if file else None
        self.cases[node.nodeid] = {"slug": slug, "entry": baselines.recorded_form(measured).to_json()}
        self.cases[node.nodeid] |= {"baseline": baseline.to_json() if baseline else {}, "recorded": False}
        if error:
            what = (
                "out of memory"
                if "out of memory" in error
                else "not finite"
                if error == _not_finite(measured)
                else "GPU busy above its step"
                if error.startswith("GPU busy time ")  # measure.trace.beyond_step: the traced step was another
                else "cannot run here"  # e.g. no C++ compiler to count the CPU allocator with
            )
            self._row(node, Row(node.name, measured, baseline, f"FAIL: {what}", estimate, error))
            return None
        if self.update or (self.update_loss and device_type == "cpu"):
            self.pending.setdefault(slug, {})[node.name] = measured
            what = "recorded" if self.update else f"loss reference of {self.cpu_model} recorded"
            self.cases[node.nodeid]["recorded"] = True
            apart = baseline is not None and checks.speed_incomparable(measured.cpu_model, baseline)  # no delta then
            status = {"tokens/s": rules.Status.NO_FIGURE} if apart else {}
            self._row(node, Row(node.name, measured, baseline, what, estimate, status=status, mfu=mfu))
            return None
        operators.count_torches(self.torches, baseline and baseline.torch, measured.torch)
        verdict = verdicts.verdict_of(
            node.name, measured, baseline, self.tolerances(file, device_type, node.name), unfit, strict=self.strict
        )
        if any(c.failed and c.note.startswith(checks.LEANER) for c in verdict.checks):
            self.leaner.append(node.nodeid)
        if baseline is not None and device_type == "cpu" and measured.convergence is None:  # a step loss held
            model = baseline.loss_reference(measured.cpu_model)[1]
            other = "" if model == measured.cpu_model else ", another CPU model: the wider tolerance"
            key = f"{model}{other}"
            self.loss_references[key] = self.loss_references.get(key, 0) + 1
        if baseline is not None and checks.other_kernels(measured, baseline):
            self.kernel_peaks[baseline.cpu_model] = self.kernel_peaks.get(baseline.cpu_model, 0) + 1
        summary = verdict.summary() if not unfit else f"machine unfit; {verdict.summary()}"
        if verdict.missing:
            summary += " (strict: FAIL)" if self.strict else ""
            self.missing.append(node.nodeid)
        for c in verdict.checks:
            if c.status == checks.NOT_GATED and c.delta is not None:
                reason = f"{c.metric} not gated: {c.note}"
                self.not_gated[reason] = self.not_gated.get(reason, 0) + 1
        self._row(
            node,
            Row(
                node.name,
                measured,
                baseline,
                summary,
                estimate,
                status={c.metric: c.status for c in verdict.checks},
                work=_work_cell(verdict),
                mfu=mfu,
            ),
        )
        return verdict

    def _row(self, node: pytest.Item, row: Row) -> None:
        self.rows.append(row)
        self.cases[node.nodeid]["row"] = row.cells()

    def _expect(self, model: str, recipe: str, device: str, figures: Figures, world: int = 1) -> list[str]:
        """Judge the expectations this case completes (gptcore.gate.expectations); the failures' lines."""
        judged = self.expected.record(model, recipe, device.split(":")[0], figures, world)
        return [o.line for o in judged if o.status == "FAIL"]

    def take_record(self, r: Record, where: str) -> Entry | None:
        """A case from a results log into the end table as it was logged (--resume, a merge of shards): its row beside
        the baseline it was judged against (older logs: this gate's file's entry); returns its measured entry."""
        if r.baseline is None:
            file = self.load(r.slug) if r.slug else None
            baseline = file.entry(r.name) if file else None
        else:
            baseline = Entry.from_json(r.baseline, f"{where}: baseline") if r.baseline else None
        measured = Entry.from_json(r.entry, where, measured=True) if r.entry else None
        operators.count_torches(self.torches, baseline and baseline.torch, measured and measured.torch)
        cells = r.row or {"verdict": r.verdict or r.outcome, "error": r.reason}
        self.rows.append(Row(r.name, measured, baseline, **cells))
        return measured

    def write_updates(self) -> None:
        """Write the recorded cases into their files, merged entry by entry (the gate calls it as each case ends);
        ``recorded`` counts them per file."""
        for slug, entries in self.pending.items():
            device = "cpu" if slug == "cpu" else "cuda"
            path = self.path_for(slug)
            counts = self.recorded.setdefault(path, [0, 0])
            if self.update_loss:
                added, skipped = baselines.add_loss_references(path, slug, entries)
                counts[0] += added
                counts[1] += len(skipped)
                continue
            baselines.update(path, slug, entries, **identity.recording(device), commit=identity.git_commit(self.root))
            counts[0] += len(entries)
        self.pending.clear()


def _not_finite(measured: Entry) -> str | None:
    """'the loss is NaN (the run diverged)' where a figure is NaN or inf (None where every figure is finite)."""
    said = [
        f"{label} is {bad}"
        for label, value in (("the loss", measured.loss), ("tokens/s", measured.tokens_per_s))
        if (bad := rules.non_finite(value))
    ]
    return (
        f"{' and '.join(said)} (the run diverged or its timing broke): nothing recorded or compared" if said else None
    )


def _mfu_cell(m: Measurement) -> str:
    return "—" if m.mfu is None else f"{m.mfu:.1%} ({m.flops_source})"


def _work_cell(verdict: Verdict) -> str:
    moved = [f"{c.metric} {int(c.delta):+,}" for c in verdict.checks if c.metric in checks.WORK_METRICS]
    moved += [operators.cell(c) for c in verdict.checks if c.metric in (operators.OPERATORS, operators.RENAMED)]
    if moved:
        return ", ".join(moved)
    work = next((c for c in verdict.checks if c.metric == "work"), None)
    return "=" if work is not None and work.status == checks.OK else "—"
