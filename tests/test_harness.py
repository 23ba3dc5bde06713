"""bench/harness.py's replay of rounds timed elsewhere: a torchrun job's ranks time their own synced rounds, and
pytest-benchmark, which cannot time them, takes those rounds as its own (its table, its --benchmark-compare and
--benchmark-compare-fail, its saved history), not the launch's wall time or the reading of a results file."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_pytest

pytestmark = pytest.mark.cpu

CASE = """
from bench.harness import replay_rounds

def test_replayed(benchmark):
    replay_rounds(benchmark, [0.5, 0.25, 1.0, 0.125, 2.0], "the ranks")

def test_nothing_to_replay(benchmark):
    replay_rounds(benchmark, [], "the ranks")
"""


def test_pytest_benchmark_takes_the_rounds_it_is_given_exactly(tmp_path):
    """Binary fractions, so every statistic is exact: median 0.5 of {0.125, 0.25, 0.5, 1, 2}, mean 3.875 / 5. A
    case with no rounds (one that failed before them) gives pytest-benchmark nothing, not a zero time."""
    (tmp_path / "test_case.py").write_text(CASE)
    out = tmp_path / "bench.json"
    result = run_pytest(tmp_path, "test_case.py", "-p", "no:cacheprovider", f"--benchmark-json={out}")
    assert result.ret == 0, result.outlines
    timed = {b["name"]: b for b in json.loads(out.read_text())["benchmarks"]}
    assert list(timed) == ["test_replayed"]
    stats = timed["test_replayed"]["stats"]
    assert (stats["rounds"], stats["min"], stats["max"], stats["median"]) == (5, 0.125, 2.0, 0.5)
    assert stats["mean"] == 3.875 / 5
    assert timed["test_replayed"]["options"]["timer"] == "rounds timed by the ranks"
