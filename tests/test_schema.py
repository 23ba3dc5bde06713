"""A baseline entry's figures are held to what a measurement can give: a number that is NaN, infinite, negative or
of the wrong kind is one line naming its field (a figure NaN or below zero passes or fails every comparison made
with it), never a traceback and never a gate that silently passes."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from gptcore.gate.schema import BaselineError, Entry

ROOT = Path(__file__).resolve().parents[1]
CASE = "test_cpu_recipes[cpu-small-bf16-pure-budget-0.60]"  # an eager CPU case: work ledger, breakdowns, losses


@pytest.fixture(scope="module")
def recorded() -> dict:
    entry = json.loads((ROOT / "baselines" / "cpu.json").read_text())["benchmarks"][CASE]
    assert entry["work"]["ops"] and entry["peak_by_category"] and entry["loss"]["by_cpu"]  # the fields planted below
    return entry


def _set(data: dict, path: tuple, value: object) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (("peak_allocated_bytes",), -1, "peak_allocated_bytes: must be a finite number >= 0, got -1"),
        (("tokens_per_s", "median"), math.nan, "tokens_per_s.median: must be a finite number >= 0, got nan"),
        (("tokens_per_s", "iqr"), -0.5, "tokens_per_s.iqr: must be a finite number >= 0, got -0.5"),
        (("loss", "value"), math.inf, "loss.value: must be a finite number >= 0, got inf"),
        (("loss", "step"), -1, "loss.step: must be a finite number >= 0, got -1"),
        (("seconds",), math.nan, "seconds: must be a finite number >= 0, got nan"),
        (("gpu_busy_seconds",), -0.001, "gpu_busy_seconds: must be a finite number >= 0, got -0.001"),
        (("work", "syncs"), -1, "work.syncs: expected an integer >= 0, got -1"),
        (("work", "allocated_bytes"), 1.5, "work.allocated_bytes: expected an integer >= 0, got 1.5"),
        (("work", "flops"), "x", "work.flops: expected an object, got 'x'"),  # was a ValueError traceback
        (("work", "flops", "forward"), -1, "work.flops.forward: expected an integer >= 0, got -1"),
        (("work", "ops"), [], "work.ops: expected an object, got []"),
        (("work", "compile"), {"graphs": -1, "kernels": 9}, "work.compile.graphs: expected an integer >= 0, got -1"),
        (("work", "top_ops"), [["aten.mm.default", True]], "work.top_ops: expected an integer >= 0, got True"),
        (("work", "top_ops"), "x", "work.top_ops: expected a list of [operator, count], got 'x'"),
    ],
)
def test_a_figure_no_measurement_gives_is_one_line_naming_its_field(recorded, where, value, message) -> None:
    broken = copy.deepcopy(recorded)
    _set(broken, where, value)
    with pytest.raises(BaselineError) as raised:
        Entry.from_json(broken, "cpu.json: benchmarks['x']")
    assert str(raised.value) == f"cpu.json: benchmarks['x']: {message}"


FIRST = "<the first name>"
"""Stands for the first name under the path in the recorded entry (an operator, a CPU model, a category)."""


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("work", "ops", "forward", FIRST), 1.5, "work.ops.forward.{}: expected an integer >= 0, got 1.5"),
        (("work", "allocations_by_op", FIRST), -1, "work.allocations_by_op.{}: expected an integer >= 0, got -1"),
        (("peak_by_category", FIRST), -1, "peak_by_category: expected an object of category -> bytes, got "),
        (("loss", "by_cpu", FIRST), math.nan, "loss.by_cpu: expected an object of CPU model -> loss, got "),
        (("estimate_by_category",), {"activations": -2}, "estimate_by_category: expected an object of category"),
        (("gpu_kernel_seconds",), {"gemm": math.inf}, "gpu_kernel_seconds: expected an object of kind -> seconds"),
    ],
)
def test_a_named_figure_out_of_range_is_one_line_naming_its_field(recorded, path, value, named) -> None:
    broken = copy.deepcopy(recorded)
    if path[-1] is FIRST:
        parent = broken
        for key in path[:-1]:
            parent = parent[key]
        path = (*path[:-1], next(iter(parent)))
    _set(broken, path, value)
    with pytest.raises(BaselineError) as raised:
        Entry.from_json(broken, "cpu.json: benchmarks['x']")
    assert str(raised.value).startswith(f"cpu.json: benchmarks['x']: {named.format(path[-1])}")
    assert "\n" not in str(raised.value)


def test_the_recorded_entry_reads_back_whole(recorded) -> None:
    """The checks refuse nothing a measurement recorded: the entry round-trips unchanged."""
    assert Entry.from_json(copy.deepcopy(recorded), "cpu.json").to_json() == recorded


def test_a_diverged_case_in_a_results_log_reads_back_and_a_baseline_file_refuses_it(recorded, tmp_path) -> None:
    """A run's own figures as its results log keeps them may be NaN or infinite (a diverged run: the gate failed
    it and recorded nothing), so --resume and a merge of shards read its line; a figure below zero is no
    measurement anywhere. The same entry in a baseline file is refused."""
    from gptcore.gate.results import Record
    from tests.test_gate import new_gate

    diverged = copy.deepcopy(recorded)
    diverged["loss"]["value"], diverged["tokens_per_s"]["median"] = math.nan, math.inf
    record = Record(nodeid=f"bench/x.py::{CASE}", name=CASE, outcome="failed", seconds=1.0, entry=diverged)
    gate = new_gate(tmp_path)
    measured = gate.take_record(record, "log: line 3")
    assert math.isnan(measured.loss) and measured.tokens_per_s == math.inf and gate.rows[0].case == CASE
    refused = r"^cpu\.json: benchmarks\['x'\]: tokens_per_s\.median: must be a finite number >= 0, got inf$"
    with pytest.raises(BaselineError, match=refused):
        Entry.from_json(diverged, "cpu.json: benchmarks['x']")
    diverged["loss"]["value"] = -1.0
    with pytest.raises(BaselineError, match=r"^log: line 3: loss\.value: must be a number >= 0, got -1\.0$"):
        gate.take_record(record, "log: line 3")
