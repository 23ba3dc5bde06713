"""Root conftest: the benchmark gate's command-line options, the ``gate`` fixture, pytest-benchmark hooks (storage per
device, machine_info with the GPU, --benchmark-compare without history) and the end-of-run table.

Markers (cpu, gpu, slow) are registered in pyproject.toml; --strict-markers is on.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gptcore import baselines
from gptcore.baselines import BaselineError, BaselineFile, Entry, Tolerances, Verdict

if TYPE_CHECKING:
    from gptcore.measure import Measurement

ROOT = Path(__file__).resolve().parent
GATE = pytest.StashKey["Gate"]()
PLUGIN_DEFAULT_STORAGE = "file://./.benchmarks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gptcore", "gptcore benchmark gate")
    group.addoption("--require-gpu", action="store_true",
                    help="fail at once when CUDA is not available (the self-hosted GPU job)")
    group.addoption("--baselines-dir", default=str(ROOT / "baselines"), metavar="DIR",
                    help="where <device-slug>.json baselines live (default: baselines/ of the repo)")
    group.addoption("--update-baselines", action="store_true",
                    help="record the cases that ran into the baseline files (atomically; other entries kept)")
    group.addoption("--baseline-strict", action="store_true",
                    help="a case with no baseline entry fails (default: it passes, says 'no baseline' and warns)")
    group.addoption("--mem-tol", type=float, metavar="FRAC", help="override the peak-memory tolerance (0.02 = +2%%)")
    group.addoption("--speed-tol", type=float, metavar="FRAC",
                    help="override the tokens/s tolerance (0.05 = -5%%); on CPU this also gates speed on any CPU "
                         "model and on a busy machine")
    group.addoption("--loss-tol", type=float, metavar="NATS", help="override both loss tolerances (absolute nats)")
    group.addoption("--bench-warmup", type=int, metavar="N", help="override every case's warm-up steps")
    group.addoption("--bench-rounds", type=int, metavar="N", help="override every case's timed rounds")
    group.addoption("--bench-steps", type=int, metavar="N", help="override every case's steps per round")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def session_slug() -> str:
    """The device this session benchmarks on: CUDA device 0 when present, else the CPU."""
    return baselines.device_slug("cuda" if _cuda_available() else "cpu")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("require_gpu") and not _cuda_available():
        import torch

        raise pytest.UsageError(f"--require-gpu: CUDA is not available (torch {torch.__version__}, built for CUDA "
                                f"{torch.version.cuda}); this job must run on a GPU runner")
    notes: list[str] = []
    if config.pluginmanager.hasplugin("benchmark") and not os.environ.get("PYTEST_XDIST_WORKER"):
        _split_storage_per_device(config)
        notes += _disable_compare_without_history(config)
    config.stash[GATE] = Gate.from_config(config, notes)


def _split_storage_per_device(config: pytest.Config) -> None:
    """pytest-benchmark keys its storage by OS/Python only: by default put each device's history apart."""
    passed = any(arg.startswith("--benchmark-storage") for arg in config.invocation_params.args)
    if not passed and config.option.benchmark_storage == PLUGIN_DEFAULT_STORAGE:
        config.option.benchmark_storage = f"{PLUGIN_DEFAULT_STORAGE}/{session_slug()}"


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


# -- the gate --------------------------------------------------------------------------------------------------------


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


@dataclass
class Gate:
    """Session state of the baselines gate: the files per device, what ran, what to record."""

    directory: Path
    update: bool
    strict: bool
    overrides: dict[str, float]
    counts_override: tuple[int | None, int | None, int | None]
    notes: list[str] = field(default_factory=list)
    files: dict[str, BaselineFile | None] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    pending: dict[str, dict[str, Entry]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    not_gated: dict[str, int] = field(default_factory=dict)
    busy_records: int = 0
    cpu_model: str = field(default_factory=baselines.cpu_model)

    @classmethod
    def from_config(cls, config: pytest.Config, notes: list[str]) -> Gate:
        overrides = {}
        for option, names in (("mem_tol", ("memory",)), ("speed_tol", ("speed",)), ("loss_tol", ("loss", "loss_amp"))):
            value = config.getoption(option)
            if value is not None:
                if value < 0 or (option == "speed_tol" and value > 1):
                    raise pytest.UsageError(f"--{option.replace('_', '-')}: {value} is out of range")
                overrides.update(dict.fromkeys(names, value))
        if "speed" in overrides:  # asked for explicitly: gate tokens/s on any CPU, busy or not
            overrides.update(speed_needs_same_cpu=False, min_cpu_share=0.0)
        counts = tuple(config.getoption(o) for o in ("bench_warmup", "bench_rounds", "bench_steps"))
        return cls(directory=Path(config.getoption("baselines_dir")), update=config.getoption("update_baselines"),
                   strict=config.getoption("baseline_strict"), overrides=overrides, counts_override=counts,
                   notes=notes)

    def counts(self, warmup: int, rounds: int, steps: int) -> tuple[int, int, int]:
        """The case's (warm-up, rounds, steps per round), with the command-line overrides applied."""
        w, r, s = self.counts_override
        return (warmup if w is None else w, rounds if r is None else r, steps if s is None else s)

    @staticmethod
    def slug_for(device: str) -> str:
        return baselines.device_slug(device)

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
        return "python -m pytest " + " ".join(f'"{n}"' for n in nodeids) + " --update-baselines"

    def summary_notes(self) -> list[str]:
        notes = list(self.notes)
        notes += [f"{reason} ({n} case{'s' if n > 1 else ''}; shown in parentheses)"
                  for reason, n in self.not_gated.items()]
        if self.busy_records:
            notes.append(f"{self.busy_records} case(s) recorded while the machine was busy (CPU share below the "
                         f"file's min_cpu_share): their tokens/s will never be gated; re-record on an idle machine")
        if self.missing:
            targets = self.missing if len(self.missing) <= 3 else list(dict.fromkeys(
                n.split("::")[0] for n in self.missing))  # many: whole files (only the cases that run are written)
            notes.append(f"{len(self.missing)} case(s) have no baseline; record them with: "
                         f"{self.record_command(*targets)}")
        return notes

    def check(self, node: pytest.Item, m: Measurement, *, precision: str,
              estimate: int | str | None) -> Verdict | None:
        """Compare a Measurement with its baseline (None when recording or when the case failed) and keep a row."""
        device_type = m.device.split(":")[0]
        slug = self.slug_for(m.device)
        measured = Entry(tokens_per_s=m.tokens_per_s, tokens_per_s_iqr=m.tokens_per_s_iqr,
                         peak_allocated_bytes=m.peak_allocated_bytes, peak_reserved_bytes=m.peak_reserved_bytes,
                         loss=m.loss, loss_step=m.loss_step, precision=precision,
                         cpu_model=self.cpu_model if device_type == "cpu" else None, cpu_share=m.cpu_share)
        file = self.load(slug)
        baseline = file.entries.get(node.name) if file else None
        if m.error:
            self.rows.append(Row(node.name, measured, baseline, "FAIL: out of memory", estimate, m.error))
            return None
        if self.update:
            self.pending.setdefault(slug, {})[node.name] = measured
            busy = m.cpu_share is not None and m.cpu_share < self.tolerances(file, device_type).min_cpu_share
            self.rows.append(Row(node.name, measured, baseline, "recorded (busy)" if busy else "recorded", estimate))
            if busy:
                self.busy_records += 1
            return None
        verdict = baselines.compare(node.name, measured, baseline, self.tolerances(file, device_type),
                                    cpu_model_now=self.cpu_model)
        summary = verdict.summary()
        if verdict.missing:
            summary += " (strict: FAIL)" if self.strict else ""
            self.missing.append(node.nodeid)
        for c in verdict.checks:
            if c.status == baselines.NOT_GATED and c.delta is not None:
                reason = f"{c.metric} not gated: {c.note}"
                self.not_gated[reason] = self.not_gated.get(reason, 0) + 1
        self.rows.append(Row(node.name, measured, baseline, summary, estimate,
                             status={c.metric: c.status for c in verdict.checks}))
        return verdict

    def write_updates(self) -> list[str]:
        """Write the recorded cases into their files; one line per file written."""
        import torch

        lines = []
        for slug, entries in self.pending.items():
            device = "cpu" if slug == "cpu" else "cuda"
            path = self.path_for(slug)
            baselines.update(path, slug, entries, device_name=baselines.device_name(device), device_type=device,
                             torch_version=torch.__version__, cuda=torch.version.cuda,
                             driver=_driver_version() if device == "cuda" else None,
                             commit=baselines.git_commit(ROOT))
            lines.append(f"baselines: recorded {len(entries)} case(s) into {path}")
        self.pending.clear()
        return lines


@pytest.fixture(scope="session")
def gate(pytestconfig: pytest.Config) -> Gate:
    """The session's baselines gate (see Gate)."""
    return pytestconfig.stash[GATE]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    bench = [item for item in items if "gate" in getattr(item, "fixturenames", ())]
    if not bench:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        skip = pytest.mark.skip(reason="pytest-benchmark is disabled under xdist: run bench/ without -n")
        for item in bench:
            item.add_marker(skip)
        return
    gate_ = config.stash[GATE]
    slugs = {"cpu"} if any(item.get_closest_marker("cpu") for item in bench) else set()
    if _cuda_available() and any(item.get_closest_marker("gpu") for item in bench):
        slugs.add(gate_.slug_for("cuda"))
    try:
        for slug in sorted(slugs):
            gate_.load(slug)
    except BaselineError as err:
        raise pytest.UsageError(f"baselines: {err}") from None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gate_ = session.config.stash.get(GATE, None)
    if gate_ is not None and gate_.pending:
        try:
            gate_.notes += gate_.write_updates()
        except (BaselineError, OSError) as err:
            gate_.notes.append(f"baselines: NOT written: {err}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's own table: ours is the last word
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from gptcore.report import gate_table

    gate_ = config.stash.get(GATE, None)
    notes = gate_.summary_notes() if gate_ is not None else []
    if gate_ is None or not (gate_.rows or notes):
        return
    terminalreporter.section("gptcore benchmark gate")
    if gate_.rows:
        terminalreporter.write_line(gate_table(gate_.rows))
    for note in notes:
        terminalreporter.write_line(note)


# -- pytest-benchmark machine_info -------------------------------------------------------------------------------------


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """GPU name, compute capability, torch, CUDA and driver versions (pytest-benchmark's machine id ignores them)."""
    import torch

    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    machine_info["cpu_model"] = baselines.cpu_model()
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["device_slug"] = session_slug()
    machine_info["python_implementation"] = platform.python_implementation()
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        machine_info["gpu"] = {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}",
                               "count": torch.cuda.device_count(), "driver": _driver_version(),
                               "cudnn": torch.backends.cudnn.version()}
    else:
        machine_info["gpu"] = None
