"""Root conftest: the benchmark gate's command-line options and thin hooks into gptcore.gate (which holds the
logic: per-device pytest-benchmark storage, machine_info with the GPU, the gate and its end-of-run table).

Markers (cpu, gpu, slow) are registered in pyproject.toml; --strict-markers is on.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

from gptcore import gate as gate_mod
from gptcore.gate import GATE, Gate

ROOT = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gptcore", "gptcore benchmark gate")
    group.addoption("--require-gpu", action="store_true",
                    help="fail at once when CUDA is not available (the self-hosted GPU job)")
    group.addoption("--baselines-dir", default=str(ROOT / "baselines"), metavar="DIR",
                    help="where <device-slug>.json baselines live (default: baselines/ of the repo)")
    group.addoption("--update-baselines", action="store_true",
                    help="record the cases that ran into the baseline files (atomically; other entries kept)")
    group.addoption("--update-loss-references", action="store_true",
                    help="add this CPU model's loss of each case that ran to its recorded entry, and change nothing "
                         "else (for a CI machine with another CPU model: the same-CPU loss tolerances then apply)")
    group.addoption("--gate-markdown", metavar="FILE", default=os.environ.get(gate_mod.MARKDOWN_ENV),
                    help="write the gate's verdict as GitHub-flavoured markdown to FILE (failures first, the table, "
                         f"the expected effects), e.g. for a PR comment; default: ${gate_mod.MARKDOWN_ENV}. With "
                         "$GITHUB_STEP_SUMMARY set (GitHub Actions) it is also appended there")
    group.addoption("--baseline-strict", action="store_true",
                    help="a case with no baseline entry fails (default: it passes, says 'no baseline' and warns)")
    group.addoption("--mem-tol", type=float, metavar="FRAC", help="override the peak-memory tolerance (0.02 = +2%%)")
    group.addoption("--speed-tol", type=float, metavar="FRAC",
                    help="override the tokens/s tolerance (0.05 = -5%%); on CPU, where tokens/s is reported but not "
                         "gated by default, this turns the gate on")
    group.addoption("--loss-tol", type=float, metavar="NATS", help="override every loss tolerance (absolute nats)")
    group.addoption("--bench-warmup", type=int, metavar="N", help="override every case's warm-up steps")
    group.addoption("--bench-rounds", type=int, metavar="N", help="override every case's timed rounds")
    group.addoption("--bench-steps", type=int, metavar="N", help="override every case's steps per round")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before pytest-benchmark's pytest_configure (trylast), which builds its session from the options that
    # gate.configure rewrites (the storage split per device, --benchmark-compare turned off without a saved run)
    config.stash[GATE] = gate_mod.configure(config)


@pytest.fixture(scope="session")
def gate(pytestconfig: pytest.Config) -> Gate:
    """The session's baselines gate (see gptcore.gate.Gate)."""
    return pytestconfig.stash[GATE]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gate_mod.preload(config, items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # after pytest-benchmark's own session finish (a hookwrapper), which compares with the saved run
    gate_mod.finish(session)


@pytest.hookimpl(wrapper=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> Generator[None, object, object]:
    """The end table after every other summary, in every outcome: pytest-benchmark raises PerformanceRegression
    from its summary when --benchmark-compare-fail fails; the run has already failed (gptcore.gate.finish) and the
    table lists the regressions, so no traceback."""
    try:
        return (yield)
    except gate_mod.PerformanceRegression:
        return []
    finally:
        gate_mod.write_summary(terminalreporter, config)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """GPU name, compute capability, torch, CUDA and driver versions (pytest-benchmark's machine id ignores them)."""
    gate_mod.update_machine_info(machine_info)
