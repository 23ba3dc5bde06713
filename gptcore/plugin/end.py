"""The end of a session: the recorded baselines written, pytest-benchmark's --benchmark-compare-fail regressions
collected, the end table and the markdown verdict, and pytest-benchmark's machine_info."""

from __future__ import annotations

import os
import platform

import pytest

from gptcore import identity
from gptcore.gate.schema import BaselineError
from gptcore.gate.summary import end_lines, gate_markdown
from gptcore.hunt.history import section as history_section
from gptcore.plugin.options import GATE

SECTION = "gptcore benchmark gate"


def finish(session: pytest.Session) -> None:
    """Write the recorded baselines and collect --benchmark-compare-fail's regressions; either failing fails the
    run, as a results log that could not be written mid-run does (its cases would be run again by --resume). Runs
    after pytest-benchmark's own session finish, which compares with the saved run."""
    gate = session.config.stash.get(GATE, None)
    if gate is None:
        return
    failed = gate.resumed_failed or gate.log_lost
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
    for line in end_lines(gate, notes):
        terminalreporter.write_line(line, red=line.startswith("FAIL"))
    if gate.rows:
        changes = history_section(config.option.benchmark_storage) if config.getoption("gate_history") else ""
        for path, mode in ((gate.markdown, "w"), (os.environ.get("GITHUB_STEP_SUMMARY"), "a")):
            if path:
                try:
                    with open(path, mode, encoding="utf-8") as out:
                        out.write(gate_markdown(gate, notes, changes))
                except OSError as err:
                    terminalreporter.write_line(f"gate markdown: NOT written to {path}: {err}", red=True)


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
