"""The benchmark gate's pytest wiring; the root conftest.py only holds thin hooks that call into here. Its modules:
``options`` (the command line), ``start`` (configure), ``cases`` (collection and each case's hooks) and ``end``.

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

from pytest_benchmark.session import PerformanceRegression

from gptcore.plugin.cases import preload
from gptcore.plugin.end import SECTION, finish, regression_lines, update_machine_info, write_summary
from gptcore.plugin.options import GATE, MARKDOWN_ENV, add_options
from gptcore.plugin.start import configure

__all__ = [
    "GATE",
    "MARKDOWN_ENV",
    "SECTION",
    "PerformanceRegression",
    "add_options",
    "configure",
    "finish",
    "preload",
    "regression_lines",
    "update_machine_info",
    "write_summary",
]
