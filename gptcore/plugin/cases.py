"""The benchmark cases in a session: the baseline files they need loaded before anything runs, --resume and
--recorded-only deselecting, the deadline before a case starts and its results-log line the moment it ends."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest

from gptcore import identity
from gptcore.gate import plan, results, shards
from gptcore.gate.results import Plan, Record
from gptcore.gate.schema import BaselineError, Entry
from gptcore.gate.session import Gate
from gptcore.measure import heap
from gptcore.plugin.options import GATE, under_xdist


class CaseHooks:
    """Per-case hooks of the benchmarks: the deadline before a case starts, and its results-log line the moment
    it ends (outcome and wall time over setup, call and teardown)."""

    def __init__(self, gate: Gate, deadline: float | None) -> None:
        self.gate, self.deadline = gate, deadline
        self.started = time.monotonic()
        self.bench: set[str] = set()
        self.history: dict[str, float] = {}
        self.resumed_plan: Plan | None = None  # --resume of a shard's log: the plan that shard began with
        self.reports: dict[str, list[pytest.TestReport]] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if config.getoption("shard") or self.resumed_plan is not None:  # a shard's log resumed: that shard
            shard(config, items, self)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # the collector kept off what the session holds before its first case (gptcore.measure.heap), in a process
        # where nothing froze before (never in a run inside a test's process, whose objects it would keep); once:
        # a freeze after a case could keep that case's model, held by a failure's traceback, for the whole session
        if gc.get_freeze_count() == 0:
            heap.freeze()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # every test, not only the benchmark cases: a stage's plain tests (the smoke's checks on a tiny model) share
        # its time, planned at their @pytest.mark.planned time or gptcore.gate.plan.OTHER_SECONDS
        if self.deadline is None:
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
            baseline=case.get("baseline"),
            recorded=case.get("recorded", False),
            effect=case.get("effect"),
            round_clocks=case.get("round_clocks"),
        )
        try:
            self.gate.log.write(record)
        except OSError as err:
            self.gate.notes.append(f"results log: NOT written to {self.gate.log.path}: {err}")
            self.gate.log, self.gate.log_lost = None, True


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else lines[-1] if lines else "failed")[:300]


def preload(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Load the baseline files the collected benchmarks need (a broken file stops the run before anything runs);
    under xdist, skip the benchmarks with the reason (pytest-benchmark switches itself off there)."""
    bench = [item for item in items if "gate" in getattr(item, "fixturenames", ())]
    if not bench:
        return
    if under_xdist():
        skip = pytest.mark.skip(reason="pytest-benchmark is disabled under xdist: run bench/ without -n")
        for item in bench:
            item.add_marker(skip)
        return
    gate = config.stash[GATE]
    hooks = config.pluginmanager.get_plugin("gptcore-cases")
    resume = config.getoption("resume")
    if resume:
        try:
            records, planned = results.read(resume), results.read_plan(resume)
            _check_resumable(config, Path(resume), records, planned)
            done = _resume(gate, records, Path(resume))
        except (results.LogError, BaselineError) as err:
            raise pytest.UsageError(f"--resume: {err}") from None
        _deselect(config, items, done)
        bench = [item for item in bench if item.nodeid not in done]
        if hooks is not None:
            hooks.history = {r.nodeid: r.seconds for r in records if r.outcome in results.FINISHED}
            hooks.resumed_plan = planned
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
    if resume and gate.log is not None and not config.option.collectonly:  # the last check passed: nothing stops
        _continue(gate.log, Path(resume))  # the run before its first line is written


def shard(config: pytest.Config, items: list[pytest.Item], hooks: CaseHooks) -> None:
    """--shard K/N: keep the benchmarks of shard K (gptcore.gate.shards), deselect the rest. Called after every other
    selection (-m, -k, --resume, --recorded-only), so that the shards split what would run. A shard's log resumed is
    that shard, --shard given or not (its plan's)."""
    k, n = hooks.resumed_plan.shard if hooks.resumed_plan is not None else shards.parse(config.getoption("shard"))
    bench = [item for item in items if item.nodeid in hooks.bench]
    seconds = {item.nodeid: hooks.planned(item).seconds for item in bench}
    unit_of = {}
    for item in bench:  # the cases of one torchrun job: every recipe of a model, world size and device at once
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "world" in params:
            module = item.nodeid.split("::")[0]  # relative: the same name on every runner
            unit_of[item.nodeid] = f"{module}::{params.get('model')}-x{params['world']}-{params.get('device')}"
    if hooks.resumed_plan is not None:  # what its plan left: a new split of what every shard left would take cases
        planned = set(hooks.resumed_plan.cases)  # of other shards and leave some of its own
        mine = [c for c in seconds if c in planned]
    else:
        mine = shards.split(seconds, unit_of, n)[k - 1]
    gone = set(seconds) - set(mine)
    _deselect(config, items, gone)
    hooks.bench -= gone
    if hooks.gate.log is not None and not config.option.collectonly:
        # a log that has a plan, resumed or started as a resumed log's copy, keeps it: the merge checks plans by it
        hooks.gate.log.write_plan(plan_of(config, (k, n), mine, len(bench)))
    hooks.gate.notes.append(
        f"--shard {k}/{n}: {len(mine)} of {len(bench)} case(s), planned {sum(seconds[c] for c in mine):,.0f} s of "
        f"{sum(seconds.values()):,.0f} s"
    )


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


def _check_resumable(config: pytest.Config, log: Path, records: list[Record], planned: Plan | None) -> None:
    """A log is resumed only by a run of its device and, for a shard's log, of its shard: another device's finished
    cases would stand in this run's end table as this device's, and another shard's plan would be kept for this
    shard's cases. LogError naming the mismatch."""
    here = identity.session_slug()
    named = {r.slug for r in records} | ({planned.slug} if planned is not None else set())
    foreign = ", ".join(sorted(named - {None, "cpu", here}))
    if foreign:
        raise results.LogError(f"{log}: its cases ran on {foreign}, and this run is on {here}: resume a log of {here}")
    asked = config.getoption("shard")
    if planned is not None and asked and planned.shard != shards.parse(asked):
        ran = "{}/{}".format(*planned.shard)
        said = f"the log of --shard {ran}, and this run is --shard {asked}: resume it with {ran}"
        raise results.LogError(f"{log}: {said}")


def _continue(log: results.ResultsLog, resumed: Path) -> None:
    """--resume A --results-log B: B starts as A's copy (its plan and records), so that B alone is the run, or
    the shard, that A began, as A resumed in place would be. A B that already holds a log is refused: its lines and
    A's would make one log of two runs."""
    if log.path.resolve() == resumed.resolve():
        return
    if log.path.exists() and log.path.stat().st_size:
        raise pytest.UsageError(
            f"--results-log {log.path}: already holds a results log; with --resume {resumed} it would start as its "
            f"copy: give a new file, or resume that log (--resume {log.path})"
        )
    try:
        log.continue_from(resumed)
    except (OSError, results.LogError) as err:
        raise pytest.UsageError(f"--results-log {log.path}: cannot start it from {resumed}: {err}") from None


def _resume(gate: Gate, records: list[Record], log: Path) -> set[str]:
    """Take the cases that ``records`` (a results log) finished into the end table as they were, and return their
    node ids: --resume runs them no more. A resumed failure fails this run too (the verdict is the union's)."""
    done = {nodeid: r for nodeid, r in results.latest(records).items() if r.outcome in results.FINISHED}
    for nodeid, r in done.items():
        gate.take_record(r, f"{log}: {nodeid}")
        gate.failures += r.failures or ([f"{r.name}: {r.reason}"] if r.outcome == "failed" else [])
        gate.resumed_failed |= r.outcome == "failed"
    gate.resumed = list(done)
    return set(done)


def plan_of(config: pytest.Config, shard: tuple[int, int], cases: list[str], split_of: int) -> Plan:
    """A shard's plan: its cases (of ``split_of`` split), and the device, commit and versions its entries carry."""
    slug = identity.session_slug()
    recording = identity.recording("cpu" if slug == "cpu" else "cuda")
    return Plan(shard, cases, slug, identity.git_commit(config.rootpath) or "", recording, split_of)
