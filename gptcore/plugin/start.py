"""``configure``: --require-gpu, pytest-benchmark's storage split per device, --benchmark-compare without a saved
run turned off with a note, the options checked before anything runs, and the session's Gate with its hooks."""

from __future__ import annotations

import datetime
import math
from pathlib import Path

import pytest

from gptcore import identity
from gptcore.config import CPU_THREADS
from gptcore.gate import shards
from gptcore.gate.results import ResultsLog, unwritable
from gptcore.gate.session import Gate
from gptcore.measure.launch import Launcher
from gptcore.plugin.cases import CaseHooks
from gptcore.plugin.options import PLUGIN_DEFAULT_STORAGE, under_xdist


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
    if config.pluginmanager.hasplugin("benchmark") and not under_xdist():
        history = _split_storage_per_device(config)
        notes += _disable_compare_without_history(config)
    gate = gate_from_config(config, notes)
    gate.history_note = history
    if not under_xdist():
        deadline = config.getoption("deadline")
        if deadline is not None and not 0 < deadline < math.inf:
            raise pytest.UsageError(f"--deadline: {deadline} is not a positive number of seconds")
        try:
            Launcher.parse(config.getoption("launcher"))
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None
        if config.getoption("shard"):
            try:
                shards.parse(config.getoption("shard"))
            except ValueError as err:
                raise pytest.UsageError(str(err)) from None
        resume = config.getoption("resume")
        asked = config.getoption("results_log") or resume
        if asked:  # a GPU job that asked for durable results must not lose them at the first case
            _check_writable(Path(asked), "--results-log" if config.getoption("results_log") else "--resume")
        if gate.markdown:  # the verdict written at the end: a path it cannot take would lose it after the run
            _check_writable(gate.markdown, "--gate-markdown")
        gate.log = ResultsLog(asked or _default_log(config))
        config.pluginmanager.register(CaseHooks(gate, deadline), "gptcore-cases")
    return gate


def _check_writable(path: Path, option: str) -> None:
    """UsageError, before any case runs, when the file at ``path`` (the results log, the markdown verdict) could not
    be written."""
    why = unwritable(path)
    if why:
        raise pytest.UsageError(f"{option} {path}: {why}")


def gate_from_config(config: pytest.Config, notes: list[str]) -> Gate:
    """The gate the command-line options ask for; UsageError for a tolerance out of range."""
    overrides = {}
    loss_fields = ("loss", "loss_amp", "loss_other_cpu", "loss_amp_other_cpu")
    fields = {"mem_tol": ("memory",), "speed_tol": ("speed",), "busy_tol": ("gpu_busy",), "loss_tol": loss_fields}
    for option, names in fields.items():
        value = config.getoption(option)
        if value is not None:  # NaN fails every comparison: it must not read as "in range"
            if not 0 <= value < math.inf or (option in ("speed_tol", "busy_tol") and value > 1):
                raise pytest.UsageError(f"--{option.replace('_', '-')}: {value} is out of range")
            overrides.update(dict.fromkeys(names, value))
    counts = tuple(config.getoption(o) for o in ("bench_warmup", "bench_rounds", "bench_steps"))
    for option, value, least in zip(("--bench-warmup", "--bench-rounds", "--bench-steps"), counts, (0, 1, 1)):
        if value is not None and value < least:
            raise pytest.UsageError(f"{option}: {value} is out of range (at least {least})")
    threads = config.getoption("bench_threads")
    if threads is not None and threads < 1:
        raise pytest.UsageError(f"--bench-threads: {threads} is out of range (at least 1)")
    if threads not in (None, CPU_THREADS):
        notes.append(
            f"--bench-threads {threads}: the single-process CPU cases ran on {threads} thread(s), their baselines on "
            f"{CPU_THREADS}; a peak inside a kernel's per-thread scratch moves with them (sdpa's CPU attention)"
        )
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
        cpu_threads=threads,
    )


def _default_log(config: pytest.Config) -> Path:
    storage = str(getattr(config.option, "benchmark_storage", "") or "")
    folder = Path(storage.removeprefix("file://")) if storage.startswith("file://") else Path(".benchmarks")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return folder / f"results-{stamp}.jsonl"


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
