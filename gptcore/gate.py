"""The benchmark gate's session logic (the root conftest.py only holds thin hooks that call into here).

* :func:`configure`: --require-gpu, pytest-benchmark storage split per device, --benchmark-compare without a
  saved run turned off with a note, and the session's :class:`Gate`;
* :class:`Gate`: the baseline files per device, one :class:`Row` per case that ran, the cases to record;
* :func:`finish`: writes the recorded cases and collects pytest-benchmark's --benchmark-compare-fail regressions,
  which fail the run;
* :func:`write_summary`: the end table (:func:`gate_table`) and its notes, printed in every outcome;
* :func:`update_machine_info`: GPU name, compute capability and versions in pytest-benchmark's machine_info.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pytest_benchmark.session import PerformanceRegression
from tabulate import tabulate

from gptcore import baselines, expectations, identity, verdicts
from gptcore.baselines import BaselineError, BaselineFile, Entry, Tolerances
from gptcore.expectations import EffectResult, Figures
from gptcore.rules import delta, delta_text
from gptcore.units import common_unit, format_bytes
from gptcore.verdicts import Verdict

if TYPE_CHECKING:
    from gptcore.convergence import Convergence
    from gptcore.measure import Measurement

__all__ = ["GATE", "Gate", "PerformanceRegression", "Row", "configure", "expectations_table", "finish", "gate_table",
           "preload", "update_machine_info", "write_summary"]

GATE = pytest.StashKey["Gate"]()
MARKDOWN_ENV = "GPTCORE_GATE_MARKDOWN"
"""The default of --gate-markdown (a workflow sets it where the test command must stay the README's)."""
PLUGIN_DEFAULT_STORAGE = "file://./.benchmarks"
SECTION = "gptcore benchmark gate"


def _under_xdist() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


# -- configuration -------------------------------------------------------------------------------------------------


def configure(config: pytest.Config) -> Gate:
    """Check --require-gpu, set up pytest-benchmark's storage and comparison, and build the session's Gate."""
    if config.getoption("require_gpu") and not identity.cuda_available():
        import torch

        raise pytest.UsageError(f"--require-gpu: CUDA is not available (torch {torch.__version__}, built for CUDA "
                                f"{torch.version.cuda}); this job must run on a GPU runner")
    notes: list[str] = []
    history = None
    if config.pluginmanager.hasplugin("benchmark") and not _under_xdist():
        history = _split_storage_per_device(config)
        notes += _disable_compare_without_history(config)
    gate = Gate.from_config(config, notes)
    gate.history_note = history
    return gate


def _split_storage_per_device(config: pytest.Config) -> str | None:
    """pytest-benchmark keys its storage by OS/Python only: by default put each device's history apart. Returns
    the note that says where it went (None when the storage was left as given)."""
    passed = any(arg.startswith("--benchmark-storage") for arg in config.invocation_params.args)
    if not passed and config.option.benchmark_storage == PLUGIN_DEFAULT_STORAGE:
        config.option.benchmark_storage = f"{PLUGIN_DEFAULT_STORAGE}/{identity.session_slug()}"
        path = config.option.benchmark_storage.removeprefix("file://./")
        return f"pytest-benchmark history for this device: {path} (pytest-benchmark list/compare need --storage {path})"
    return None


def _disable_compare_without_history(config: pytest.Config) -> list[str]:
    """--benchmark-compare on a runner with no saved run would make --benchmark-compare-fail a UsageError at the
    end: say so and turn both off for this run (the baselines gate still applies)."""
    compare = config.option.benchmark_compare
    storage = config.option.benchmark_storage
    if not compare or not storage.startswith("file://"):
        return []
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.storage.file import FileStorage
    from pytest_benchmark.utils import get_machine_id

    files = FileStorage(storage[len("file://"):], logger=Logger(Logger.QUIET, config=config),
                        default_machine_id=get_machine_id())
    if list(files.load() if compare is True else files.load(compare)):
        return []
    config.option.benchmark_compare = []
    config.option.benchmark_compare_fail = None
    return [f"--benchmark-compare: no saved benchmark run{'' if compare is True else f' matching {compare!r}'} in "
            f"{files.path} (first run on this runner? save one with --benchmark-autosave); comparison and "
            f"--benchmark-compare-fail are off for this run, the baselines gate still applies"]


# -- the gate ------------------------------------------------------------------------------------------------------


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
    """Each optimization's declared effect, judged within the run (gptcore.expectations)."""

    @classmethod
    def from_config(cls, config: pytest.Config, notes: list[str]) -> Gate:
        """The gate the command-line options ask for; UsageError for a tolerance out of range."""
        overrides = {}
        loss_fields = ("loss", "loss_amp", "loss_other_cpu", "loss_amp_other_cpu")
        for option, names in (("mem_tol", ("memory",)), ("speed_tol", ("speed",)), ("loss_tol", loss_fields)):
            value = config.getoption(option)
            if value is not None:
                if value < 0 or (option == "speed_tol" and value > 1):
                    raise pytest.UsageError(f"--{option.replace('_', '-')}: {value} is out of range")
                overrides.update(dict.fromkeys(names, value))
        counts = tuple(config.getoption(o) for o in ("bench_warmup", "bench_rounds", "bench_steps"))
        if config.getoption("update_baselines") and config.getoption("update_loss_references"):
            raise pytest.UsageError("--update-baselines and --update-loss-references: choose one")
        markdown = config.getoption("gate_markdown")
        return cls(directory=Path(config.getoption("baselines_dir")), update=config.getoption("update_baselines"),
                   markdown=Path(markdown) if markdown else None,
                   update_loss=config.getoption("update_loss_references"),
                   strict=config.getoption("baseline_strict"), overrides=overrides, timing_override=counts,
                   root=config.rootpath, notes=notes)

    def timing(self, warmup: int, rounds: int, steps: int) -> tuple[int, int, int]:
        """The case's (warm-up, rounds, steps per round), with the command-line overrides applied."""
        w, r, s = self.timing_override
        return (warmup if w is None else w, rounds if r is None else r, steps if s is None else s)

    def path_for(self, slug: str) -> Path:
        return self.directory / f"{slug}.json"

    def load(self, slug: str) -> BaselineFile | None:
        """The device's baseline file (cached); BaselineError when it is unusable."""
        if slug not in self.files:
            self.files[slug] = baselines.load(self.path_for(slug), expect_slug=slug)
        return self.files[slug]

    def tolerances(self, file: BaselineFile | None, device_type: str) -> Tolerances:
        base = file.tolerances if file else Tolerances.default_for(device_type)
        return dataclasses.replace(base, **self.overrides)

    @staticmethod
    def record_command(*nodeids: str) -> str:
        """The command that records these cases into their baseline files."""
        return "python -m pytest " + " ".join(f'"{n}"' for n in nodeids) + " --update-baselines"

    def summary_notes(self) -> list[str]:
        """The lines under the end table: setup notes, what was not gated, what to record, the regressions."""
        notes = list(self.notes)
        notes += [f"{reason} ({n} case{'s' if n > 1 else ''}; shown in parentheses)"
                  for reason, n in self.not_gated.items()]
        if self.missing:
            targets = self.missing if len(self.missing) <= 3 else list(dict.fromkeys(
                n.split("::")[0] for n in self.missing))  # many: whole files (only the cases that run are written)
            notes.append(f"{len(self.missing)} case(s) have no baseline; record them with: "
                         f"{self.record_command(*targets)}")
        unchecked = self.expected.unchecked()
        if unchecked:
            notes.append(f"expectations not checked, their reference did not run (-k?): {', '.join(unchecked)}")
        for model, n in self.loss_references.items():
            notes.append(f"loss held to the reference of {model} ({n} case{'s' if n > 1 else ''})")
        if self.history_note and self.rows:
            notes.append(self.history_note)
        return notes + self.regressions

    def judge(self, node: pytest.Item, m: Measurement, *, model: str, recipe: str, precision: str,
              estimate: int | str | None, estimate_by_category: dict[str, int] | None = None,
              world: int = 1) -> Outcome:
        """The one hand-over of a benchmark case: its Measurement against the baseline (a row of the end table, or
        recorded under --update-baselines), then the expected effects it completes. ``estimate_by_category``: the
        estimate's peak by category, kept to say where a memory change is."""
        measured = Entry.from_measurement(m, precision=precision, cpu_model=self.cpu_model,
                                          estimate_by_category=estimate_by_category)
        verdict = self.judge_entry(node, measured, m.device, estimate=estimate, error=m.error, mfu=_mfu_cell(m))
        unmet = [] if m.error else self._expect(model, recipe, m, estimate, world)
        return self._outcome(node, m.device, m.error, verdict, unmet)

    def judge_convergence(self, node: pytest.Item, run: Convergence | None, *, device: str, precision: str,
                          error: str | None = None) -> Outcome:
        """The hand-over of a convergence case (gptcore.convergence); ``run`` is None when it failed with
        ``error``."""
        measured = Entry.from_convergence(run, device=device, precision=precision, cpu_model=self.cpu_model)
        return self._outcome(node, device, error, self.judge_entry(node, measured, device, error=error), [])

    def _outcome(self, node: pytest.Item, device: str, error: str | None, verdict: Verdict | None,
                 unmet: list[str]) -> Outcome:
        failures = [f"{node.name}: {error}"] if error else []
        failures += [verdict.failure_message()] if verdict is not None and verdict.failed else []
        failures += [f"{node.name}: expected effect not met: {line}" for line in unmet]
        missing = None
        if not failures and verdict is not None and verdict.missing:
            missing = (f"{node.name}: no baseline for {identity.device_slug(device)}; record it with: "
                       f"{self.record_command(node.nodeid)}")
            if self.strict:
                failures.append(missing + " (--baseline-strict)")
        self.failures += failures
        return Outcome(verdict, failures, missing)

    def judge_entry(self, node: pytest.Item, measured: Entry, device: str, *, estimate: int | str | None = None,
                    error: str | None = None, mfu: str = "—") -> Verdict | None:
        """Record (under --update-baselines) or judge ``measured`` against the device's baseline, and keep a row."""
        device_type = device.split(":")[0]
        slug = identity.device_slug(device)
        file = self.load(slug)
        baseline = file.entries.get(node.name) if file else None
        if error:
            self.rows.append(Row(node.name, measured, baseline, "FAIL: out of memory", estimate, error))
            return None
        if self.update or (self.update_loss and device_type == "cpu"):
            self.pending.setdefault(slug, {})[node.name] = measured
            what = "recorded" if self.update else f"loss reference of {self.cpu_model} recorded"
            self.rows.append(Row(node.name, measured, baseline, what, estimate))
            return None
        verdict = verdicts.verdict_of(node.name, measured, baseline, self.tolerances(file, device_type))
        if baseline is not None and device_type == "cpu" and measured.convergence is None:  # a step loss held
            model = baseline.loss_reference(measured.cpu_model)[1]
            other = "" if model == measured.cpu_model else ", another CPU model: the wider tolerance"
            key = f"{model}{other}"
            self.loss_references[key] = self.loss_references.get(key, 0) + 1
        summary = verdict.summary()
        if verdict.missing:
            summary += " (strict: FAIL)" if self.strict else ""
            self.missing.append(node.nodeid)
        for c in verdict.checks:
            if c.status == verdicts.NOT_GATED and c.delta is not None:
                reason = f"{c.metric} not gated: {c.note}"
                self.not_gated[reason] = self.not_gated.get(reason, 0) + 1
        self.rows.append(Row(node.name, measured, baseline, summary, estimate,
                             status={c.metric: c.status for c in verdict.checks},
                             work=_work_cell(verdict), mfu=mfu))
        return verdict

    def _expect(self, model: str, recipe: str, m: Measurement, estimate: int | str | None,
                world: int = 1) -> list[str]:
        """Judge the expectations this case completes (gptcore.expectations); the failures' lines."""
        figures = Figures(m.peak_allocated_bytes, m.tokens_per_s, m.tokens_per_s_iqr, estimate)
        judged = self.expected.record(model, recipe, m.device.split(":")[0], figures, world)
        return [o.line for o in judged if o.status == "FAIL"]

    def write_updates(self) -> list[str]:
        """Write the recorded cases into their files; one line per file written."""
        import torch

        lines = []
        for slug, entries in self.pending.items():
            device = "cpu" if slug == "cpu" else "cuda"
            path = self.path_for(slug)
            if self.update_loss:
                added, skipped = baselines.add_loss_references(path, slug, entries)
                lines.append(f"baselines: added {added} loss reference(s) of {self.cpu_model} to {path}"
                             + (f"; skipped {len(skipped)} (no entry, or a loss read at another step)"
                                if skipped else ""))
                continue
            baselines.update(path, slug, entries, device_name=identity.device_name(device), device_type=device,
                             torch_version=torch.__version__, cuda=torch.version.cuda,
                             driver=identity.driver_version() if device == "cuda" else None,
                             commit=identity.git_commit(self.root))
            lines.append(f"baselines: recorded {len(entries)} case(s) into {path}")
        self.pending.clear()
        return lines


# -- hooks' bodies -------------------------------------------------------------------------------------------------


def preload(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Load the baseline files the collected benchmarks need (a broken file stops the run before anything runs);
    under xdist, skip the benchmarks with the reason (pytest-benchmark switches itself off there)."""
    bench = [item for item in items if "gate" in getattr(item, "fixturenames", ())]
    if not bench:
        return
    if _under_xdist():
        skip = pytest.mark.skip(reason="pytest-benchmark is disabled under xdist: run bench/ without -n")
        for item in bench:
            item.add_marker(skip)
        return
    gate = config.stash[GATE]
    def marked(*names: str) -> bool:
        return any(item.get_closest_marker(name) for item in bench for name in names)

    slugs = {"cpu"} if marked("cpu", "convergence") else set()
    if identity.cuda_available() and marked("gpu", "convergence"):
        slugs.add(identity.device_slug("cuda"))
    try:
        for slug in sorted(slugs):
            gate.load(slug)
    except BaselineError as err:
        raise pytest.UsageError(f"baselines: {err}") from None


def finish(session: pytest.Session) -> None:
    """Write the recorded baselines and collect --benchmark-compare-fail's regressions; either failing fails the
    run. Runs after pytest-benchmark's own session finish, which compares with the saved run."""
    gate = session.config.stash.get(GATE, None)
    if gate is None:
        return
    failed = False
    if gate.pending:
        try:
            gate.notes += gate.write_updates()
        except (BaselineError, OSError) as err:
            gate.notes.append(f"baselines: NOT written: {err}")
            failed = True
    gate.regressions = regression_lines(session.config)
    if (failed or gate.regressions) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def regression_lines(config: pytest.Config) -> list[str]:
    """One 'FAIL: <case> (<saved run>): <pytest-benchmark's own message>' line per --benchmark-compare-fail check
    that failed, as pytest-benchmark found them in its session finish (nothing recomputed here)."""
    bench = getattr(config, "_benchmarksession", None)
    return [f"FAIL: {name}: {message}" for name, message in getattr(bench, "performance_regressions", None) or []]


def write_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The end table and its notes as the 'gptcore benchmark gate' section (nothing when there is neither)."""
    gate = config.stash.get(GATE, None)
    notes = gate.summary_notes() if gate is not None else []
    if gate is None or not (gate.rows or notes):
        return
    terminalreporter.section(SECTION)
    if gate.rows:
        terminalreporter.write_line(gate_table(gate.rows))
    if any(r.measured and r.measured.convergence for r in gate.rows):
        terminalreporter.write_line(f"{CONVERGENCE}:")
        terminalreporter.write_line(convergence_table(gate.rows))
    if gate.expected.outcomes:
        terminalreporter.write_line(f"{PAYS}:")
        terminalreporter.write_line(expectations_table(gate.expected.outcomes))
    for note in notes:
        terminalreporter.write_line(note, red=note.startswith("FAIL"))
    if gate.rows:
        for path, mode in ((gate.markdown, "w"), (os.environ.get("GITHUB_STEP_SUMMARY"), "a")):
            if path:
                try:
                    with open(path, mode, encoding="utf-8") as out:
                        out.write(gate_markdown(gate, notes))
                except OSError as err:
                    terminalreporter.write_line(f"gate markdown: NOT written to {path}: {err}", red=True)


CONVERGENCE = "does it still learn (convergence runs: validation loss and time-to-loss)"
PAYS = "does each optimization still pay (expected effects, judged within this run)"


def gate_markdown(gate: Gate, notes: Sequence[str]) -> str:
    """The verdict as GitHub-flavoured markdown: the failing cases first, one line each; then the table; then the
    expected effects; then the notes."""
    failures = gate.failures + [line.removeprefix("FAIL: ") for line in gate.regressions]
    verdict = f"FAIL: {len(failures)} failure(s)" if failures else "ok"
    out = [f"## gptcore benchmark gate: {verdict} ({len(gate.rows)} case{'s' if len(gate.rows) != 1 else ''})", ""]
    if failures:
        out += ["### Failing", "", *(f"- {_md_escape(line)}" for line in failures), ""]
    out += ["### Cases", "", gate_table(gate.rows, tablefmt="github"), ""]
    if any(r.measured and r.measured.convergence for r in gate.rows):
        out += [f"### {CONVERGENCE[0].upper()}{CONVERGENCE[1:]}", "", convergence_table(gate.rows, "github"), ""]
    if gate.expected.outcomes:
        out += [f"### {PAYS[0].upper()}{PAYS[1:]}", "", expectations_table(gate.expected.outcomes, "github"), ""]
    rest = [n for n in notes if not n.startswith("FAIL")]
    if rest:
        out += ["<details><summary>notes</summary>", "", *(f"- {_md_escape(n)}" for n in rest), "", "</details>", ""]
    return "\n".join(out) + "\n"


def _md_escape(text: str) -> str:
    """Text safe in a markdown list item or table cell ([, ], | and * are markdown)."""
    return text.replace("|", "\\|").replace("[", "\\[").replace("]", "\\]").replace("*", "\\*")


# -- the end table -------------------------------------------------------------------------------------------------


def _mfu_cell(m: Measurement) -> str:
    return "—" if m.mfu is None else f"{m.mfu:.1%} ({m.flops_source})"


def _work_cell(verdict: Verdict) -> str:
    moved = [c for c in verdict.checks if c.metric in verdicts.WORK_METRICS]
    if moved:
        return ", ".join(f"{c.metric} {int(c.delta):+,}" for c in moved)
    work = next((c for c in verdict.checks if c.metric == "work"), None)
    return "=" if work is not None and work.status == verdicts.OK else "—"


def _pct(measured: float | None, baseline: float | None, status: str | None = None) -> str:
    return delta_text(delta(measured, baseline, relative=True), status)


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def gate_table(rows: Sequence[Row], tablefmt: str = "simple") -> str:
    """One line per case: tokens/s and peak memory measured / baseline / delta (in parentheses when not gated),
    the estimate over the measured peak, MFU and the source of its FLOPs, the loss and its drift, what moved in the
    work ledger, and the verdict. Both memory columns share one unit."""
    peaks = [(r.measured.peak_allocated_bytes if r.measured else None,
              r.baseline.peak_allocated_bytes if r.baseline else None) for r in rows]
    unit = common_unit(b for pair in peaks for b in pair)
    table = []
    for row, (peak, base_peak) in zip(rows, peaks):
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
        table.append([
            row.case,
            _num(m.tokens_per_s if m else None, ",.0f"), _num(b.tokens_per_s if b else None, ",.0f"),
            _pct(m.tokens_per_s if m else None, b.tokens_per_s if b else None, row.status.get("tokens/s")),
            format_bytes(peak, unit), format_bytes(base_peak, unit),
            _pct(peak, base_peak, row.status.get("peak memory")),
            est_meas, row.mfu,
            ("val " if m and m.convergence else "") + _num(loss, ".4f"), loss_delta, row.work,
            row.verdict if not row.error else f"{row.verdict} ({row.error})",
        ])
    headers = ["case", "tok/s", "base tok/s", "Δ", "peak", "base peak", "Δ", "est/meas", "MFU", "loss", "Δ loss",
               "work", "verdict"]
    if tablefmt == "github":
        table = [[_md_escape(cell) for cell in line] for line in table]
    return tabulate(table, headers=headers, disable_numparse=True, stralign="right", tablefmt=tablefmt)


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
        table.append([
            row.case, f"{now.val_loss[0]:.3f}", f"{now.val_loss[mid]:.3f} @{now.steps[mid]}",
            f"{now.final_val_loss:.4f} @{now.steps[-1]}", _num(before.final_val_loss if before else None, ".4f"),
            _num(now.target_loss, "g"),
            "never" if reached is None else f"{reached[0]:,} ({reached[1]:,} tok, {reached[2]:.0f} s)",
            "—" if before is None else "never" if was is None else f"{was[0]:,}",
            _num(now.tokens_per_s, ",.0f"), row.verdict,
        ])
    headers = ["case", "val @0", "val mid", "val end", "base end", "target", "time-to-loss (steps)", "base steps",
               "tok/s", "verdict"]
    if tablefmt == "github":
        table = [[_md_escape(cell) for cell in line] for line in table]
    return tabulate(table, headers=headers, disable_numparse=True, stralign="right", tablefmt=tablefmt)


def expectations_table(outcomes: Sequence[EffectResult], tablefmt: str = "simple") -> str:
    """One line per expectation judged: the model, the claim, the case against its reference, the bound (with the
    estimate's prediction for memory) and the status."""
    rows = [[o.model, o.claim, o.measured, o.expected, o.status] for o in outcomes]
    if tablefmt == "github":
        rows = [[_md_escape(cell) for cell in row] for row in rows]
    return tabulate(rows, headers=["model", "expected effect", "measured", "bound", "status"],
                    disable_numparse=True, tablefmt=tablefmt)


# -- pytest-benchmark machine_info ---------------------------------------------------------------------------------


def update_machine_info(machine_info: dict) -> None:
    """GPU name, compute capability, torch, CUDA and driver versions (pytest-benchmark's machine id ignores them)."""
    import torch

    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    machine_info["cpu_model"] = identity.cpu_model()
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["device_slug"] = identity.session_slug()
    machine_info["python_implementation"] = platform.python_implementation()
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        machine_info["gpu"] = {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
                               "count": torch.cuda.device_count(), "driver": identity.driver_version(),
                               "cudnn": torch.backends.cudnn.version()}
    else:
        machine_info["gpu"] = None
