"""A CPU speed figure goes into a baseline only when the machine was quiet while it was measured, and the gate, the
end table and the report show no delta against one that was not, or one from another CPU model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gptcore.config import Recipe
from gptcore.gate import baselines, rules, verdicts
from gptcore.gate.schema import Entry, Tolerances
from gptcore.gate.summary import gate_table
from gptcore.measure import runner as measure
from tests.helpers import TINY, fake_share
from tests.test_gate import new_gate

pytestmark = pytest.mark.cpu
NODE = SimpleNamespace(name="test_x[tiny-fp32]", nodeid="bench/x.py::test_x[tiny-fp32]")
CPU = "AMD EPYC (family 25, model 17)"


def measured_with_share(monkeypatch: pytest.MonkeyPatch, share: float):
    """A tiny CPU case whose every round reports ``share`` of the CPU."""
    fake_share(monkeypatch, share)
    return measure.run_case(TINY, Recipe(), "cpu", warmup=1, rounds=3, steps_per_round=1)


def test_a_low_share_on_a_rank_of_several_names_the_waits_and_not_only_a_busy_machine(monkeypatch):
    # FSDP2 ranks on an idle 2-core machine measured shares of 0.65 to 0.77: each sleeps in its collectives
    fake_share(monkeypatch, 0.72)
    runner = measure.CaseRunner(TINY, Recipe(), torch.device("cpu"), warmup=1, steps_per_round=1)
    runner.prepare()
    for _ in range(3):
        runner.calibrate()
        runner.round()
    runner.trainer.rank = dataclasses.replace(runner.trainer.rank, world_size=2)
    m = runner.finish()
    assert m.speed_note == (
        "speed not recorded: share 0.72 (ranks waiting on each other's collectives, or a busy machine)"
    )
    assert m.tokens_per_s > 0


@pytest.mark.parametrize(
    "second, note",
    [(1.09e-3, None), (1.12e-3, "speed not recorded: machine busy (calibration kernel 12% off its median)")],
)
def test_a_calibration_kernel_more_than_10_percent_off_its_median_records_no_speed(monkeypatch, second, note):
    """The kernel timed before each round stands in for the machine's speed: one round's kernel 12% slower than their
    median means that round ran on a slower machine, even at a full share of the CPU; 9% is within the spread."""
    fake_share(monkeypatch, 1.0)
    kernel_seconds = iter([1e-3, second, 1e-3])
    monkeypatch.setattr(measure, "calibration_kernel", lambda: next(kernel_seconds))
    m = measure.run_case(TINY, Recipe(), "cpu", warmup=1, rounds=3, steps_per_round=1)
    assert m.calibration_seconds == [1e-3, second, 1e-3] and m.speed_note == note


def test_a_busy_machine_records_no_speed_and_the_table_shows_no_delta(monkeypatch, tmp_path: Path):
    busy = measured_with_share(monkeypatch, 0.33)
    assert busy.speed_note == "speed not recorded: machine busy (share 0.33)"
    assert busy.tokens_per_s > 0 and len(busy.calibration_seconds) == 3 and busy.calibrated_cost > 0
    gate = new_gate(tmp_path, update=True, cpu_model=CPU)
    gate.judge_entry(NODE, Entry.from_measurement(busy, precision="fp32", cpu_model=CPU), "cpu")
    gate.write_updates()
    recorded = baselines.load(tmp_path / "cpu.json").entries[NODE.name]
    assert recorded.tokens_per_s is None and recorded.tokens_per_s_iqr is None
    assert recorded.speed_note == busy.speed_note and recorded.peak_allocated_bytes == busy.peak_allocated_bytes

    quiet = measured_with_share(monkeypatch, 1.0)
    now = Entry.from_measurement(quiet, precision="fp32", cpu_model=CPU)
    verdict = verdicts.verdict_of(NODE.name, now, recorded, Tolerances.default_for("cpu"))
    speed = next(c for c in verdict.checks if c.metric == "tokens/s")
    assert speed.delta is None and speed.note == busy.speed_note
    judge = new_gate(tmp_path, cpu_model=CPU)
    judge.judge_entry(NODE, now, "cpu")
    row = gate_table(judge.rows).splitlines()[-1].split()
    assert row[1] == f"{quiet.tokens_per_s:,.0f}" and row[2:4] == ["—", "—"]  # tok/s, no base tok/s, no delta


def test_no_delta_against_a_speed_from_another_cpu_model_or_an_old_busy_recording():
    base = Entry(
        tokens_per_s=800.0,
        tokens_per_s_iqr=5.0,
        peak_allocated_bytes=10,
        peak_reserved_bytes=None,
        loss=1.0,
        loss_step=15,
        cpu_model="Intel(R) Xeon(R) Processor",
        cpu_share=0.99,
    )
    now = dataclasses.replace(base, tokens_per_s=11_000.0, cpu_model=CPU)
    tol = dataclasses.replace(Tolerances.default_for("cpu"), speed=0.05)  # even with speed gated
    speed = next(c for c in verdicts.verdict_of("c", now, base, tol).checks if c.metric == "tokens/s")
    assert speed.delta is None and speed.note == "speed recorded on another CPU model (Intel(R) Xeon(R) Processor)"
    busy = dataclasses.replace(base, cpu_model=CPU, cpu_share=0.33)
    speed = next(c for c in verdicts.verdict_of("c", now, busy, tol).checks if c.metric == "tokens/s")
    assert speed.delta is None and speed.note == "speed recorded on a busy machine (share 0.33)"
    same = dataclasses.replace(base, cpu_model=CPU)
    speed = next(c for c in verdicts.verdict_of("c", now, same, tol).checks if c.metric == "tokens/s")
    assert speed.delta == pytest.approx(11_000 / 800 - 1)  # a quiet recording on this CPU model: compared


def test_the_report_shows_no_delta_for_a_busy_entry():
    from gptcore.report.figures import case_checks
    from gptcore.report.tables import Record

    base = Entry(
        tokens_per_s=None,
        tokens_per_s_iqr=None,
        peak_allocated_bytes=10,
        peak_reserved_bytes=None,
        loss=1.0,
        loss_step=15,
        cpu_model=CPU,
        speed_note="speed not recorded: machine busy (share 0.33)",
    )
    record = Record(
        group="g",
        name="test_x[tiny-fp32]",
        model="tiny",
        recipe="fp32",
        values={"speed": 11_000.0},
        info={"cpu_model": CPU, "peak_allocated_bytes": 10},
    )
    speed, memory = case_checks(record, base, Tolerances.default_for("cpu"))
    assert speed.delta is None and speed.status == rules.Status.NO_FIGURE and memory.delta == 0


@pytest.mark.parametrize("mode", ["update", "update_loss"])
def test_recording_shows_no_speed_delta_against_another_cpu_models_speed(tmp_path: Path, mode: str):
    other = Entry(
        tokens_per_s=21_613.0,
        tokens_per_s_iqr=5.0,
        peak_allocated_bytes=10,
        peak_reserved_bytes=None,
        loss=1.0,
        loss_step=15,
        cpu_model="Intel(R) Xeon(R) Processor",
        cpu_share=0.99,
    )
    baselines.update(tmp_path / "cpu.json", "cpu", {NODE.name: other}, device_name="CPU", device_type="cpu")
    gate = new_gate(tmp_path, update=mode == "update", update_loss=mode == "update_loss", cpu_model=CPU)
    now = dataclasses.replace(other, tokens_per_s=740.0, cpu_model=CPU)  # bf16 emulated: -96.6% is no news
    gate.judge_entry(NODE, now, "cpu")
    row = gate_table(gate.rows).splitlines()[-1].split()
    assert row[1:4] == ["740", "21,613", "—"]  # tok/s, base tok/s from the other model, and no delta
