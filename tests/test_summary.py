"""The end table and the markdown verdict of a recorded CPU run, byte for byte.

``tests/data/gate_render/`` holds what the gate printed for ``tests/data/cpu-run.json`` (10 CPU-shape cases) against
a frozen copy of the CPU baselines of the run's vintage (``tests/data/baselines-frozen/cpu.json``) when it was one
module; the split into gptcore.gate.session (judging), gptcore.gate.summary (rendering) and gptcore.plugin (pytest
wiring) did not change a byte. The run is moved so that every status shows: a case over its memory tolerance, one
leaner, one faster with speed gated, an out-of-memory case, a case with no baseline under --baseline-strict, unmet
expected effects, and a convergence run slower to its target. After a change meant to alter the output, rewrite the
files with ``python -m tests.test_summary`` and review the diff (as when the gate stopped showing a speed delta against
a busy recording, and began to fail an exact figure that went down under --baseline-strict).

Below it, the notes under the end table that the recorded run does not reach, one by one: the results log, the cases
to record, an expected effect left unchecked, the rounds a GPU's clocks left out.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from gptcore.gate import results
from gptcore.gate.rules import Status
from tests.test_gate import judge_case, new_gate

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GOLDEN = DATA / "gate_render"
FROZEN = DATA / "baselines-frozen"
CPU_MODEL = "AMD EPYC (family 25, model 17)"
TORCH = json.loads((FROZEN / "cpu.json").read_text())["torch"]
"""The run is judged as measured under its baselines' torch, whichever this process runs (another is said under the
table)."""


@mock.patch("gptcore.identity.torch_version", new=lambda: TORCH)
def render_recorded_run() -> tuple[str, str]:
    """(the end table, its convergence and expectations tables and notes; the markdown verdict)."""
    from gptcore.gate import baselines
    from gptcore.gate.summary import convergence_table, expectations_table, gate_markdown, gate_table
    from gptcore.measure.convergence import Convergence
    from gptcore.measure.measurement import Measurement

    run = json.loads((DATA / "cpu-run.json").read_text())
    gate = new_gate(FROZEN, strict=True, overrides={"speed": 0.05}, cpu_model=CPU_MODEL)
    names = {f.name for f in dataclasses.fields(Measurement)}
    moves = itertools.cycle([(1.0, 1.0), (1.03, 0.90), (0.97, 1.10), (1.01, 0.97), (1.02, 1.05)])
    for i, (bench, (memory, speed)) in enumerate(zip(run["benchmarks"], moves)):
        info = dict(bench["extra_info"])
        info["peak_allocated_bytes"] = round(info["peak_allocated_bytes"] * memory)
        info["tokens_per_s"] *= speed
        if i == 3:
            info["error"] = "out of memory after 0 steps: planted"
        m = Measurement(**{k: v for k, v in info.items() if k in names})
        name = bench["name"] if i != 5 else bench["name"].replace("]", "-unrecorded]")
        node = SimpleNamespace(name=name, nodeid=f"bench/test_cpu_shape.py::{name}")
        gate.judge(
            node,
            m,
            model=info["model"],
            recipe=info["recipe"],
            precision=info["precision"],
            estimate=info["estimate_bytes"],
        )
    name = "test_convergence_cpu_shape_short[cpu-small-ckpt-fp32]"
    before = baselines.load(FROZEN / "cpu.json").entries[name].convergence
    now = Convergence(
        before.steps,
        [v + 0.01 for v in before.val_loss],
        before.train_loss,
        before.seconds,
        before.tokens_per_step,
        before.target_loss,
    )
    gate.judge_convergence(
        SimpleNamespace(name=name, nodeid=f"bench/test_convergence_cpu_shape.py::{name}"),
        now,
        device="cpu",
        precision="fp32",
    )
    notes = gate.summary_notes()
    table = "\n".join(
        [gate_table(gate.rows), convergence_table(gate.rows), expectations_table(gate.expected.outcomes), *notes]
    )
    return table, gate_markdown(gate, notes)


def test_end_table_and_markdown_of_a_recorded_run_are_unchanged_byte_for_byte() -> None:
    table, markdown = render_recorded_run()
    assert table == (GOLDEN / "table.txt").read_text()
    assert markdown == (GOLDEN / "markdown.md").read_text()
    for status in (
        "FAIL: peak memory",
        "leaner than the baseline",
        "FAIL: out of memory",
        "no baseline (strict: FAIL)",
        "expected effect not met",
        "FAIL: time-to-loss",
    ):
        assert status in markdown  # the recorded run reaches every status it is meant to pin


def test_the_markdown_counts_pytest_benchmarks_regressions_and_escapes_what_would_break_it() -> None:
    """--benchmark-compare-fail's regressions fail the run as the gate's own failures do, so the verdict's headline
    counts them and lists each; a case id or a note holding markdown ('|' splits a cell, '[..]' reads as a link,
    '*' as emphasis) is escaped (history's section too: tests/test_history.py)."""
    from gptcore.gate.summary import gate_markdown

    gate = SimpleNamespace(
        failures=["test_x[a|b]: peak memory +9.0% > 5%"],
        regressions=["FAIL: test_y[*c*] (0001_abc): Field 'median' has failed PercentageRegressionCheck"],
        rows=[],
        expected=SimpleNamespace(outcomes=[]),
    )
    verdict = gate_markdown(gate, ["note [see] *this*"])
    assert verdict.startswith("## gptcore benchmark gate: FAIL: 2 failure(s) (0 cases)")
    assert "- test_x\\[a\\|b\\]: peak memory +9.0% > 5%" in verdict
    assert "- test_y\\[\\*c\\*\\] (0001_abc): Field 'median' has failed PercentageRegressionCheck" in verdict
    assert "- note \\[see\\] \\*this\\*" in verdict


def test_the_results_log_is_named_under_the_table_once_a_case_ran_or_was_not_started(tmp_path: Path) -> None:
    from gptcore.gate.session import Row

    log = tmp_path / "results.jsonl"
    line = f"results log: {log} (--resume {log} runs what it has not finished)"
    gate = new_gate(tmp_path, log=SimpleNamespace(path=log))
    assert gate.summary_notes() == []  # nothing ran (pytest tests): no log to resume
    gate.not_started = ["test_x[b]"]
    assert gate.summary_notes() == ["deadline: 1 case(s) not started: test_x[b]", line]
    gate.not_started, gate.rows = [], [Row("test_x[a]", None, None, "ok")]
    assert gate.summary_notes() == [line]


def test_up_to_three_cases_without_a_baseline_are_recorded_by_name_and_more_by_their_files(tmp_path: Path) -> None:
    gate = new_gate(tmp_path)
    gate.missing = ["bench/a.py::t[1]", "bench/a.py::t[2]", "bench/b.py::t[3]"]
    assert gate.summary_notes() == [
        '3 case(s) have no baseline; record them with: python -m pytest "bench/a.py::t[1]" "bench/a.py::t[2]" '
        '"bench/b.py::t[3]" --update-baselines'
    ]
    gate.missing.append("bench/b.py::t[4]")
    assert gate.summary_notes() == [
        '4 case(s) have no baseline; record them with: python -m pytest "bench/a.py" "bench/b.py" --update-baselines'
    ]


def test_an_expected_effect_whose_reference_did_not_run_is_named_under_the_table(tmp_path: Path) -> None:
    """checkpoint's effect is judged against fp32: run alone (-k), it is named as not checked, not passed."""
    from gptcore.gate.expectations import Figures

    gate = new_gate(tmp_path)
    gate.expected.record("cpu-small", "checkpoint", "cpu", Figures(20_000_000, None, None, None))
    assert gate.summary_notes() == [
        "expectations not checked, their reference did not run (-k?): cpu-small checkpoint (needs fp32)"
    ]


def test_rounds_left_out_below_the_gpus_clocks_are_counted_under_the_table(tmp_path: Path) -> None:
    """measure.clocks flags rounds run below the GPU's clocks and the median leaves them out: the note says how
    many rounds tokens/s stands on, and each left-out round's flag ('cpu' names the device only to spare the test a
    GPU). Every round's clocks also go into the case's line of the results log, as the case hooks write it when the
    case ends (the line read back, so a flag's why can be read after the run)."""
    from gptcore.plugin.cases import CaseHooks

    log = results.ResultsLog(tmp_path / "run.jsonl")
    gate = new_gate(tmp_path, log=log)
    hooks = CaseHooks(gate, deadline=None)
    hooks.bench = {"bench/x.py::test_x[a]", "bench/x.py::test_x[c]"}
    judge_case(gate, "a", round_seconds=[1.0, 1.0, 2.0, 2.0], flagged_rounds=[2, 3])
    assert gate.notes == ["test_x[a]: tokens/s over 2 of 4 rounds, the rest ran below the GPU's clocks"]
    flags = [{}, {}, {"flag": "thermal (hardware)"}, {"flag": "SM clock 1200 MHz < 75% of 1980"}]
    judge_case(gate, "c", round_seconds=[1.0, 1.0, 2.0, 2.0], flagged_rounds=[2, 3], round_clocks=flags)
    assert gate.notes[-1] == (
        "test_x[c]: tokens/s over 2 of 4 rounds, the rest ran below the GPU's clocks (round 3: thermal (hardware); "
        "round 4: SM clock 1200 MHz < 75% of 1980)"
    )
    for nodeid in sorted(hooks.bench):  # each case ends: pytest's report of it, then its line in the log
        hooks.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, failed=False, skipped=False, duration=1.0))
        hooks.pytest_runtest_logfinish(nodeid)
    lines = {record.name: record for record in results.read(log.path)}
    assert set(lines) == {"test_x[a]", "test_x[c]"} and lines["test_x[c]"].round_clocks == flags
    assert lines["test_x[a]"].round_clocks is None  # a's rounds sampled no clocks: none are written
    judge_case(gate, "b", round_seconds=[1.0, 1.0, 2.0, 2.0], flagged_rounds=[])  # none left out: nothing to say
    assert len(gate.notes) == 2


if __name__ == "__main__":
    table, markdown = render_recorded_run()
    (GOLDEN / "table.txt").write_text(table)
    (GOLDEN / "markdown.md").write_text(markdown)
    print(f"wrote {GOLDEN}/table.txt and markdown.md")


def test_a_status_prints_formats_and_serializes_as_its_text_on_every_python() -> None:
    # the statuses go into the end table, f-strings, JSON and the markdown verdict as their text; a (str, Enum) (the
    # project runs on Python 3.10, which has no enum.StrEnum) prints "Status.FAIL" unless its __str__ says otherwise
    for status in Status:
        assert str(status) == f"{status}" == format(status, "") == f"{status:<0}" == status.value
        assert json.dumps({"status": status}) == json.dumps({"status": status.value})
        assert status == status.value and Status(status.value) is status
