"""The benchmark gate's pytest wiring; the root conftest.py only holds thin hooks that call into here.

* :func:`add_options`: the gate's command-line options;
* :func:`configure`: --require-gpu, pytest-benchmark storage split per device, --benchmark-compare without a
  saved run turned off with a note, and the session's :class:`~gptcore.gate.session.Gate`;
* :func:`preload`: the baseline files the collected benchmarks need, loaded before anything runs;
* :func:`finish`: writes the recorded cases and collects pytest-benchmark's --benchmark-compare-fail regressions,
  which fail the run;
* :func:`write_summary`: the end table and its notes (rendered by :mod:`gptcore.gate.summary`), printed in every
  outcome, and the markdown verdict;
* :func:`update_machine_info`: GPU name, compute capability and versions in pytest-benchmark's machine_info.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from pathlib import Path

import pytest
from pytest_benchmark.session import PerformanceRegression

from gptcore import identity
from gptcore.gate import plan, results
from gptcore.gate.baselines import BaselineError, Entry
from gptcore.gate.results import Record, ResultsLog
from gptcore.gate.session import Gate, Row
from gptcore.gate.summary import CONVERGENCE, PAYS, convergence_table, expectations_table, gate_markdown, gate_table
from gptcore.hunt.history import section as history_section

__all__ = [
    "GATE",
    "PerformanceRegression",
    "add_options",
    "configure",
    "finish",
    "preload",
    "regression_lines",
    "update_machine_info",
    "write_summary",
]

GATE = pytest.StashKey[Gate]()
MARKDOWN_ENV = "GPTCORE_GATE_MARKDOWN"
"""The default of --gate-markdown (a workflow sets it where the test command must stay the README's)."""
PLUGIN_DEFAULT_STORAGE = "file://./.benchmarks"
SECTION = "gptcore benchmark gate"
DEADLINE_ENV = "GPTCORE_DEADLINE"
"""The default of --deadline, for scripts whose pytest command stays the same."""


def add_options(parser: pytest.Parser, root: Path) -> None:
    """The gate's command-line options; ``root`` is the repository (its baselines/ is the default)."""
    group = parser.getgroup("gptcore", "gptcore benchmark gate")
    group.addoption(
        "--require-gpu", action="store_true", help="fail at once when CUDA is not available (the self-hosted GPU job)"
    )
    group.addoption(
        "--baselines-dir",
        default=str(root / "baselines"),
        metavar="DIR",
        help="where <device-slug>.json baselines live (default: baselines/ of the repo)",
    )
    group.addoption(
        "--update-baselines",
        action="store_true",
        help="record the cases that ran into the baseline files (atomically; other entries kept)",
    )
    group.addoption(
        "--update-loss-references",
        action="store_true",
        help="add this CPU model's loss of each case that ran to its recorded entry, and change nothing "
        "else (for a CI machine with another CPU model: the same-CPU loss tolerances then apply)",
    )
    group.addoption(
        "--gate-markdown",
        metavar="FILE",
        default=os.environ.get(MARKDOWN_ENV),
        help="write the gate's verdict as GitHub-flavoured markdown to FILE (failures first, the table, "
        f"the expected effects), e.g. for a PR comment; default: ${MARKDOWN_ENV}. With "
        "$GITHUB_STEP_SUMMARY set (GitHub Actions) it is also appended there",
    )
    group.addoption(
        "--baseline-strict",
        action="store_true",
        help="a case with no baseline entry fails (default: it passes, says 'no baseline' and warns)",
    )
    group.addoption("--mem-tol", type=float, metavar="FRAC", help="override the peak-memory tolerance (0.02 = +2%%)")
    group.addoption(
        "--speed-tol",
        type=float,
        metavar="FRAC",
        help="override the tokens/s tolerance (0.05 = -5%%); on CPU, where tokens/s is reported but not "
        "gated by default, this turns the gate on",
    )
    group.addoption("--loss-tol", type=float, metavar="NATS", help="override every loss tolerance (absolute nats)")
    group.addoption("--bench-warmup", type=int, metavar="N", help="override every case's warm-up steps")
    group.addoption("--bench-rounds", type=int, metavar="N", help="override every case's timed rounds")
    group.addoption("--bench-steps", type=int, metavar="N", help="override every case's steps per round")
    group.addoption(
        "--gate-history",
        action="store_true",
        help="add the change points in this device's saved runs (pytest-benchmark's storage; "
        "python -m gptcore history) to the markdown verdict",
    )
    group.addoption(
        "--cpu-speed",
        action="store_true",
        help="on CPU, time each study's full rounds (a tokens/s median worth reading); by default a CPU "
        "case times only the few rounds its exact checks need (memory, loss, work ledger)",
    )
    group.addoption(
        "--results-log",
        metavar="FILE",
        help="append one JSON line per case to FILE the moment the case ends (flushed and fsynced); "
        "default: beside pytest-benchmark's saved runs, .benchmarks/<device>/results-<time>.jsonl "
        "(with --resume: the log resumed)",
    )
    group.addoption(
        "--resume",
        metavar="LOG",
        help="run only the cases that the results log LOG has not finished (passed or failed); the end "
        "table shows the union, the finished cases as LOG has them",
    )
    group.addoption(
        "--deadline",
        type=float,
        metavar="SECONDS",
        default=_env_float(DEADLINE_ENV),
        help="start no case that would likely end more than SECONDS after pytest started (judged from "
        "the case's last time in the results log or its baseline, else from its FLOPs at an "
        f"assumed throughput: gptcore/gate/plan.py); skip those with the reason 'deadline'. "
        f"Default: ${DEADLINE_ENV}",
    )
    group.addoption(
        "--recorded-only",
        action="store_true",
        help="run only the cases that have an entry in their device's baseline file, and deselect the "
        "rest (say, after recording part of a study: check what was recorded and nothing else)",
    )


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    try:
        return float(value) if value else None
    except ValueError:
        raise pytest.UsageError(f"${name}: {value!r} is not a number of seconds") from None


def _under_xdist() -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


# -- configuration -------------------------------------------------------------------------------------------------


def configure(config: pytest.Config) -> Gate:
    """Check --require-gpu, set up pytest-benchmark's storage and comparison, and build the session's Gate."""
    if config.getoption("require_gpu") and not identity.cuda_available():
        import torch

        raise pytest.UsageError(
            f"--require-gpu: CUDA is not available (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); this job must run on a GPU runner"
        )
    notes: list[str] = []
    history = None
    if config.pluginmanager.hasplugin("benchmark") and not _under_xdist():
        history = _split_storage_per_device(config)
        notes += _disable_compare_without_history(config)
    gate = gate_from_config(config, notes)
    gate.history_note = history
    if not _under_xdist():
        deadline = config.getoption("deadline")
        if deadline is not None and deadline <= 0:
            raise pytest.UsageError(f"--deadline: {deadline} is not a positive number of seconds")
        resume = config.getoption("resume")
        asked = config.getoption("results_log") or resume
        if asked:  # a GPU job that asked for durable results must not lose them at the first case
            _check_writable(Path(asked), "--results-log" if config.getoption("results_log") else "--resume")
        gate.log = ResultsLog(asked or _default_log(config))
        config.pluginmanager.register(CaseHooks(gate, deadline), "gptcore-cases")
    return gate


def _check_writable(path: Path, option: str) -> None:
    """UsageError, before any case runs, when the results log at ``path`` could not be appended to."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise pytest.UsageError(f"{option} {path}: cannot create its folder: {err.strerror}") from None
    target = path if path.exists() else path.parent
    if path.is_dir() or not os.access(target, os.W_OK):
        why = "is a folder" if path.is_dir() else "not writable"
        raise pytest.UsageError(f"{option} {path}: {why}; give a file this run can append to")


def gate_from_config(config: pytest.Config, notes: list[str]) -> Gate:
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
    directory = Path(config.getoption("baselines_dir"))
    given = any(a == "--baselines-dir" or a.startswith("--baselines-dir=") for a in config.invocation_params.args)
    if given and not directory.is_dir() and not config.getoption("update_baselines"):  # a misspelt folder would
        # turn the gate off without a word: every case "no baseline", and the run green
        what = "not a folder" if directory.exists() else "no such folder"
        raise pytest.UsageError(f"--baselines-dir {directory}: {what} (record into a new one with --update-baselines)")
    return Gate(
        directory=directory,
        update=config.getoption("update_baselines"),
        markdown=Path(markdown) if markdown else None,
        update_loss=config.getoption("update_loss_references"),
        strict=config.getoption("baseline_strict"),
        overrides=overrides,
        timing_override=counts,
        root=config.rootpath,
        notes=notes,
        cpu_speed=config.getoption("cpu_speed"),
    )


def _default_log(config: pytest.Config) -> Path:
    storage = str(getattr(config.option, "benchmark_storage", "") or "")
    folder = Path(storage.removeprefix("file://")) if storage.startswith("file://") else Path(".benchmarks")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return folder / f"results-{stamp}.jsonl"


class CaseHooks:
    """Per-case hooks of the benchmarks: the deadline before a case starts, and its results-log line the moment
    it ends (outcome and wall time over setup, call and teardown)."""

    def __init__(self, gate: Gate, deadline: float | None) -> None:
        self.gate, self.deadline = gate, deadline
        self.started = time.monotonic()
        self.bench: set[str] = set()
        self.history: dict[str, float] = {}
        self.reports: dict[str, list[pytest.TestReport]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.deadline is None or item.nodeid not in self.bench:
            return
        planned = self.planned(item)
        left = self.deadline - (time.monotonic() - self.started)
        if planned.seconds > left:
            self.gate.not_started.append(item.name)
            pytest.skip(
                f"deadline: {max(left, 0):.0f} s left of {self.deadline:.0f} s, the case would take about "
                f"{planned.seconds:.0f} s ({planned.source})"
            )

    def planned(self, item: pytest.Item) -> plan.Estimate:
        _, entry = _baseline_entry(self.gate, item)
        return plan.estimate(item, self.history, self.gate.timing_override, entry.seconds if entry else None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid in self.bench:
            self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        reports = self.reports.pop(nodeid, [])
        if nodeid not in self.bench or not reports or self.gate.log is None:
            return
        failed = next((r for r in reports if r.failed), None)
        skipped = next((r for r in reports if r.skipped), None)
        outcome = "failed" if failed else "skipped" if skipped else "passed"
        reason = None
        if failed is not None:
            reason = _first_line(failed.longreprtext)
        elif skipped is not None and isinstance(skipped.longrepr, tuple):
            reason = str(skipped.longrepr[2]).removeprefix("Skipped: ")
        case = self.gate.cases.get(nodeid, {})
        record = Record(
            nodeid=nodeid,
            name=nodeid.rsplit("::", 1)[-1],
            outcome=outcome,
            seconds=round(sum(r.duration for r in reports), 3),
            reason=reason,
            slug=case.get("slug"),
            verdict=(case.get("row") or {}).get("verdict"),
            failures=case.get("failures", []),
            row=case.get("row"),
            entry=case.get("entry"),
            recorded=case.get("recorded", False),
        )
        try:
            self.gate.log.write(record)
        except OSError as err:
            self.gate.notes.append(f"results log: NOT written to {self.gate.log.path}: {err}")
            self.gate.log = None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else lines[-1] if lines else "failed")[:300]


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

    files = FileStorage(
        storage[len("file://") :], logger=Logger(Logger.QUIET, config=config), default_machine_id=get_machine_id()
    )
    if list(files.load() if compare is True else files.load(compare)):
        return []
    config.option.benchmark_compare = []
    config.option.benchmark_compare_fail = None
    return [
        f"--benchmark-compare: no saved benchmark run{'' if compare is True else f' matching {compare!r}'} in "
        f"{files.path} (first run on this runner? save one with --benchmark-autosave); comparison and "
        f"--benchmark-compare-fail are off for this run, the baselines gate still applies"
    ]


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
    hooks = config.pluginmanager.get_plugin("gptcore-cases")
    resume = config.getoption("resume")
    if resume:
        try:
            records = results.read(resume)
            done = _resume(gate, records, Path(resume))
        except (results.LogError, BaselineError) as err:
            raise pytest.UsageError(f"--resume: {err}") from None
        _deselect(config, items, done)
        bench = [item for item in bench if item.nodeid not in done]
        if hooks is not None:
            hooks.history = {r.nodeid: r.seconds for r in records if r.outcome in results.FINISHED}
    if hooks is not None:
        hooks.bench = {item.nodeid for item in bench}

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
    if config.getoption("recorded_only"):
        # a case that cannot be looked up here (a GPU case on a CPU machine) stays, and skips itself with its reason
        lookups = {item.nodeid: _baseline_entry(gate, item) for item in bench}
        gone = {nodeid for nodeid, (known, entry) in lookups.items() if known and entry is None}
        _deselect(config, items, gone)
        if hooks is not None:
            hooks.bench -= gone
        gate.notes.append(f"--recorded-only: {len(gone)} case(s) with no baseline entry deselected")


def _deselect(config: pytest.Config, items: list[pytest.Item], nodeids: set[str]) -> None:
    """Take the items with these node ids out of the run, reported as deselected (as -k does)."""
    dropped = [item for item in items if item.nodeid in nodeids]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in nodeids]


def _baseline_entry(gate: Gate, item: pytest.Item) -> tuple[bool, Entry | None]:
    """Whether ``item``'s device can be looked up here (a study case on the CPU, or on CUDA with CUDA present),
    and its entry in that device's loaded baseline file (None when it has none)."""
    case = plan.item_case(item)
    if case is None or (case["device"] != "cpu" and not identity.cuda_available()):
        return False, None
    file = gate.files.get(identity.device_slug(case["device"]))
    return True, file.entries.get(item.name) if file else None


def _resume(gate: Gate, records: list[Record], log: Path) -> set[str]:
    """Take the cases that ``records`` (a results log) finished into the end table as they were, and return their
    node ids: --resume runs them no more. A resumed failure fails this run too (the verdict is the union's)."""
    done = {nodeid: r for nodeid, r in results.latest(records).items() if r.outcome in results.FINISHED}
    for nodeid, r in done.items():
        file = gate.load(r.slug) if r.slug else None
        baseline = file.entries.get(r.name) if file else None
        measured = Entry.from_json(r.entry, f"{log}: {nodeid}") if r.entry else None
        cells = r.row or {"verdict": r.verdict or r.outcome, "error": r.reason}
        gate.rows.append(Row(r.name, measured, baseline, **cells))
        gate.failures += r.failures or ([f"{r.name}: {r.reason}"] if r.outcome == "failed" else [])
        gate.resumed_failed |= r.outcome == "failed"
    gate.resumed = list(done)
    return set(done)


def finish(session: pytest.Session) -> None:
    """Write the recorded baselines and collect --benchmark-compare-fail's regressions; either failing fails the
    run. Runs after pytest-benchmark's own session finish, which compares with the saved run."""
    gate = session.config.stash.get(GATE, None)
    if gate is None:
        return
    failed = gate.resumed_failed
    if gate.pending:  # each case is written as it ends; anything left is written now
        try:
            gate.write_updates()
        except (BaselineError, OSError) as err:
            gate.notes.append(f"baselines: NOT written: {err}")
            failed = True
    gate.regressions = regression_lines(session.config)
    if gate.resumed and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:  # all was done: the union is
        session.exitstatus = pytest.ExitCode.OK  # the run's result, not "no tests"
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
        changes = history_section(config.option.benchmark_storage) if config.getoption("gate_history") else ""
        for path, mode in ((gate.markdown, "w"), (os.environ.get("GITHUB_STEP_SUMMARY"), "a")):
            if path:
                try:
                    with open(path, mode, encoding="utf-8") as out:
                        out.write(gate_markdown(gate, notes, changes))
                except OSError as err:
                    terminalreporter.write_line(f"gate markdown: NOT written to {path}: {err}", red=True)


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
        machine_info["gpu"] = {
            "name": torch.cuda.get_device_name(0),
            "compute_capability": f"{major}.{minor}",
            "count": torch.cuda.device_count(),
            "driver": identity.driver_version(),
            "cudnn": torch.backends.cudnn.version(),
        }
    else:
        machine_info["gpu"] = None
