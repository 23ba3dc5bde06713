"""Root conftest: thin hooks into gptcore.plugin (the benchmark gate's options and pytest wiring; the gate's state
and judgment are in gptcore.gate.session, the end table in gptcore.gate.summary).

Markers (cpu, gpu, slow, convergence, planned) are registered in pyproject.toml; --strict-markers is on.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from gptcore import plugin
from gptcore.gate.session import Gate

ROOT = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    plugin.add_options(parser, ROOT)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before pytest-benchmark's pytest_configure (trylast), which builds its session from the options that
    # plugin.configure rewrites (the storage split per device, --benchmark-compare turned off without a saved run)
    config.stash[plugin.GATE] = plugin.configure(config)


@pytest.fixture(scope="session")
def gate(pytestconfig: pytest.Config) -> Gate:
    """The session's baselines gate (see gptcore.gate.session.Gate)."""
    return pytestconfig.stash[plugin.GATE]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    plugin.preload(config, items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # after pytest-benchmark's own session finish (a hookwrapper), which compares with the saved run
    plugin.finish(session)


@pytest.hookimpl(wrapper=True)
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> Generator[None, object, object]:
    """The end table after every other summary, in every outcome: pytest-benchmark raises PerformanceRegression
    from its summary when --benchmark-compare-fail fails; the run has already failed (gptcore.plugin.finish) and
    the table lists the regressions, so no traceback."""
    try:
        return (yield)
    except plugin.PerformanceRegression:
        return []
    finally:
        plugin.write_summary(terminalreporter, config)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    """GPU name, compute capability, torch, CUDA and driver versions (pytest-benchmark's machine id ignores them)."""
    plugin.update_machine_info(machine_info)
