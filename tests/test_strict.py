"""--baseline-strict judges every exact figure both ways on any CPU model: each work-ledger count, and the CPU
peak (eager or compiled), made lower alone in a copy of the recorded baselines fails as leaner under strict and
passes without it, measured on a CPU model other than the one that recorded the entry (the counts and the peak
measured the same on two CPU models: docs/gate.md). A CPU baseline file counts the CPU models that recorded its
entries."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import Counter

import pytest

from gptcore.gate import baselines, checks, schema, verdicts
from gptcore.measure.work import CompileStats
from tests.test_gate import ROOT

pytestmark = pytest.mark.cpu

EAGER, COMPILED = "test_cpu_recipes[cpu-small-fp32]", "test_cpu_recipes[cpu-small-compile]"
"""An eager case and a compiled one (the compile counts too), each with the peak the CPU allocator counted."""
COMPILE_COUNTS = ("graphs", "graph breaks", "recompiles", "kernels")
OTHER_CPU = "Another CPU (family 0, model 0)"


def raise_count(entry: schema.Entry, metric: str) -> None:
    """Make ``metric`` of ``entry`` higher than measured (so that the measurement reads lower than it)."""
    work = entry.work
    if metric == "peak memory":
        entry.peak_allocated_bytes += 8
    elif metric == "flops":
        work.flops["forward"] += 8
    elif metric == "op calls":
        work.op_calls["forward"] += 8
    elif metric == "syncs":
        work.syncs += 1
    elif metric == "allocations":
        work.allocations += 8
    elif metric == "allocated bytes":
        work.allocated_bytes += 8
    else:
        field = {"graphs": "graphs", "graph breaks": "graph_breaks", "recompiles": "recompiles", "kernels": "kernels"}[
            metric
        ]
        setattr(work.compile, field, getattr(work.compile, field) + 1)


@pytest.mark.parametrize(
    ("metric", "case"),
    [
        ("peak memory", EAGER),
        ("peak memory", COMPILED),  # the allocator's count sees inside compiled code: gated the same way
        *((m, COMPILED if m in COMPILE_COUNTS else EAGER) for m in checks.WORK_METRICS),
    ],
)
def test_a_count_below_its_baseline_fails_strict_as_leaner_on_any_cpu_model(metric: str, case: str) -> None:
    recorded = baselines.load(ROOT / "baselines" / "cpu.json", "cpu")
    base = copy.deepcopy(recorded.entries[case])
    assert base.cpu_model != OTHER_CPU
    assert isinstance(base.work.compile, CompileStats) if case == COMPILED else True
    assert base.peak_allocated_bytes > 0
    measured = dataclasses.replace(copy.deepcopy(base), cpu_model=OTHER_CPU)  # the same figures, another CPU
    raise_count(base, metric)
    strict = verdicts.verdict_of(case, measured, base, recorded.tolerances, strict=True)
    [check] = [c for c in strict.checks if c.metric == metric]
    assert strict.failed and check.status == checks.FAIL and checks.LEANER in check.note
    lenient = verdicts.verdict_of(case, measured, base, recorded.tolerances)
    [check] = [c for c in lenient.checks if c.metric == metric]
    # a count passes with the refresh note; 8 bytes of memory are within the memory tolerance (2%): plain ok
    assert not lenient.failed and check.status == (checks.OK if metric == "peak memory" else checks.BETTER)
    # the same figures pass either way: nothing but the planted count moved
    assert not verdicts.verdict_of(case, measured, recorded.entries[case], recorded.tolerances, strict=True).failed


def test_a_cpu_file_counts_the_models_that_recorded_its_entries(tmp_path) -> None:
    path = tmp_path / "cpu.json"
    entry = schema.Entry(
        tokens_per_s=1.0,
        tokens_per_s_iqr=0.0,
        peak_allocated_bytes=1,
        peak_reserved_bytes=None,
        loss=1.0,
        loss_step=1,
        cpu_model="CPU A",
    )
    baselines.update(path, "cpu", {"a": entry, "b": entry}, device_name="CPU", device_type="cpu")
    baselines.update(
        path, "cpu", {"b": dataclasses.replace(entry, cpu_model="CPU B")}, device_name="CPU", device_type="cpu"
    )
    data = baselines.load(path, "cpu").to_json()
    assert data["device"] == {"slug": "cpu", "name": "CPU", "type": "cpu", "models": {"CPU A": 1, "CPU B": 1}}
    committed = json.loads((ROOT / "baselines" / "cpu.json").read_text())  # the file as committed says the same
    models = Counter(e["cpu_model"] for e in committed["benchmarks"].values() if e.get("cpu_model"))
    assert committed["device"] == {"slug": "cpu", "name": "CPU", "type": "cpu", "models": dict(sorted(models.items()))}
