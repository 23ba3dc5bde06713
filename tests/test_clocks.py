"""GPU clocks and throttling, proved on CPU with a fake NVML: a round run below the GPU's clocks is flagged and
left out of the tokens/s median, more than half flagged makes the case "machine unfit" (never a regression), and
the clocks are recorded with the baseline so that a run at other clocks is told apart from a code change."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptcore.config import Recipe
from gptcore.gate import baselines, checks, verdicts
from gptcore.gate.schema import Entry, Tolerances
from gptcore.measure import clocks
from gptcore.measure.runner import CaseRunner
from gptcore.measure.timing import throughput
from tests.helpers import TINY, fake_share
from tests.test_gate import new_gate
from tests.test_trace import recorded  # noqa: F401 (a fixture: the runner's traced step with a recorded timeline)

pytestmark = pytest.mark.cpu

DEFAULT_SM = 1980  # an H100 SXM's default application SM clock, MHz
FAST = dict(sm=1980, reasons=0)
SLOW = dict(sm=1200, reasons=0)  # below 75% of 1980 (1485 MHz)
HOT = dict(sm=1755, reasons=0x40)  # hardware thermal slowdown at a clock that alone would pass
IDLE = dict(sm=1980, reasons=0x01 | 0x02)  # idle and application-clock bits: not slowdowns
CAPPED = dict(sm=1830, reasons=0x04)  # software power cap at 700 W, as an H200 ran GPT-2: a busy GPU's normal state
CAPPED_LOW = dict(sm=1470, reasons=0x04)  # the same cap under a heavier step: below 75% of 1980, the work's own clock


def fake_nvml(script: list[dict]) -> SimpleNamespace:
    """An NVML module whose readings follow ``script``, one entry per sample."""
    readings = iter(script)
    now: dict = {}

    def clock(handle, kind):
        if kind == clocks.NVML_CLOCK_SM:
            now.clear()
            now.update(next(readings))
            return now["sm"]
        return 2619

    return SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: "gpu0",
        nvmlDeviceGetDefaultApplicationsClock=lambda h, kind: DEFAULT_SM,
        nvmlDeviceGetClockInfo=clock,
        nvmlDeviceGetTemperature=lambda h, sensor: 71,
        nvmlDeviceGetPowerUsage=lambda h: 612_000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: now["reasons"],
    )


def reading(
    sm: int = 1980, *, mem: int = 2619, temp: int = 70, power: float = 600.0, reasons: int = 0
) -> clocks.Sample:
    """One NVML reading, made directly."""
    return clocks.Sample(sm_mhz=sm, mem_mhz=mem, temperature_c=temp, power_w=power, reasons=reasons)


def run_rounds(script: list[dict]):
    """A tiny CPU case timed for len(script) rounds, each sampled by the fake NVML."""
    runner = CaseRunner(
        TINY, Recipe(), "cpu", warmup=1, steps_per_round=1, gpu_clocks=clocks.Clocks(fake_nvml(script), "gpu0")
    )
    runner.prepare()
    for _ in script:
        runner.round()
    return runner.finish()


def test_a_round_below_the_clocks_or_throttled_is_flagged_and_left_out_of_the_median():
    m = run_rounds([FAST, SLOW, FAST, HOT, IDLE, FAST, CAPPED, CAPPED_LOW])
    assert m.flagged_rounds == [1, 3]
    assert "SM clock 1200 MHz < 75% of 1980" in m.round_clocks[1]["flag"]
    assert m.round_clocks[3]["flag"] == "thermal (hardware)"
    assert "flag" not in m.round_clocks[4]  # idle and application-clock reasons are no slowdown
    assert "flag" not in m.round_clocks[6]  # nor the power cap, at a clock above 75% of the default
    assert "flag" not in m.round_clocks[7]  # nor below it: the power cap holds the clock where the work's draw puts it
    kept = [s for i, s in enumerate(m.round_seconds) if i not in (1, 3)]
    assert (m.tokens_per_s, m.tokens_per_s_iqr) == throughput(kept, m.tokens_per_step)
    assert m.unfit is None
    assert m.clocks == {
        "sm_mhz": 1980,
        "mem_mhz": 2619,
        "default_sm_mhz": DEFAULT_SM,
        "temperature_c_max": 71,
        "power_w_median": 612.0,
        "flagged_rounds": 2,
        "rounds": 8,
    }


def test_a_step_that_holds_the_power_cap_below_the_slow_clock_keeps_every_round_and_its_speed():
    """On an H200 the batch that fills the device (ladder-9, B=146) held a median of 1515-1620 MHz at the 700 W cap
    over four runs, 77-82% of the default 1980, and one round of seven fell below 75% in two of them (flagged then,
    and left out of the median). A heavier step at the same cap sits lower still: were the power cap's clock flagged,
    its every round would be, and the case "machine unfit", its speed never recorded. Its clock is recorded instead."""
    m = run_rounds([CAPPED_LOW] * 4)
    assert m.flagged_rounds == [] and m.unfit is None
    assert (m.tokens_per_s, m.tokens_per_s_iqr) == throughput(m.round_seconds, m.tokens_per_step)
    assert m.clocks["sm_mhz"] == 1470 and m.clocks["flagged_rounds"] == 0
    # the same low clock with no power cap holding it is a GPU below its clocks: flagged, as SLOW is
    assert clocks.Clocks(fake_nvml([]), "gpu0").flag(reading(1470)) == "SM clock 1470 MHz < 75% of 1980"


def test_half_the_rounds_flagged_is_no_unfit_machine_the_other_half_give_the_speed():
    m = run_rounds([SLOW, FAST, HOT, FAST])
    assert m.flagged_rounds == [0, 2] and m.unfit is None
    assert (m.tokens_per_s, m.tokens_per_s_iqr) == throughput(
        [m.round_seconds[1], m.round_seconds[3]], m.tokens_per_step
    )


def test_more_than_half_flagged_is_machine_unfit_and_never_a_regression(tmp_path: Path, monkeypatch):
    fake_share(monkeypatch, 1.0)  # a quiet machine: the planted slowdown below needs a recorded speed to be judged
    m = run_rounds([SLOW, HOT, FAST, SLOW])
    assert m.flagged_rounds == [0, 1, 3] and m.unfit.startswith("machine unfit: 3 of 4 rounds")
    measured = Entry.from_measurement(m, precision="fp32", cpu_model=None)
    assert measured.clocks == m.clocks  # recorded with a baseline, but not its speed: no reference
    assert measured.speed_note == f"speed not recorded: {m.unfit}"
    assert baselines.recorded_form(measured).tokens_per_s is None
    baseline = dataclasses.replace(measured, tokens_per_s=measured.tokens_per_s * 10, speed_note=None)  # 90% slower
    tol = dataclasses.replace(Tolerances.default_for("cuda"))
    assert verdicts.verdict_of("case", measured, baseline, tol).failed  # the planted slowdown, judged plainly
    verdict = verdicts.verdict_of("case", measured, baseline, tol, unfit=m.unfit)
    speed = next(c for c in verdict.checks if c.metric == "tokens/s")
    assert not verdict.failed and speed.status == checks.NOT_GATED and speed.note == m.unfit
    gate = new_gate(tmp_path)
    node = SimpleNamespace(name="test_x[tiny-fp32]", nodeid="bench/x.py::test_x[tiny-fp32]")
    gate.judge_entry(node, measured, "cpu", unfit=m.unfit)
    assert gate.rows[-1].verdict.startswith("machine unfit")


def speed_against(tokens_per_s: float, sm_mhz: int, base_tokens_per_s: float, base_sm_mhz: int) -> checks.Check:
    """The tokens/s check of a GPU run against a baseline, each at its median SM clock."""
    now = Entry(
        tokens_per_s=tokens_per_s,
        tokens_per_s_iqr=1.0,
        peak_allocated_bytes=10,
        peak_reserved_bytes=10,
        loss=1.0,
        loss_step=5,
        clocks={"sm_mhz": sm_mhz},
    )
    before = dataclasses.replace(now, tokens_per_s=base_tokens_per_s, clocks={"sm_mhz": base_sm_mhz})
    verdict = verdicts.verdict_of("c", now, before, Tolerances.default_for("cuda"))
    return next(c for c in verdict.checks if c.metric == "tokens/s")


def test_the_busy_times_traced_step_has_its_clock_sampled_while_its_work_runs(recorded):  # noqa: F811
    """The busy time is read from a step traced apart from the timed rounds (a warm-up step, then the one read), at a
    clock of its own: NVML is read after each traced step is queued, as after each round's, and the read step's SM
    clock is kept beside the rounds' as ``traced_sm_mhz``, recorded with the baseline entry."""
    script = [FAST, FAST, FAST, CAPPED, dict(sm=1620, reasons=0x04)]  # three rounds, then the two traced steps
    runner = CaseRunner(
        TINY, Recipe(), "cpu", warmup=1, steps_per_round=1, gpu_clocks=clocks.Clocks(fake_nvml(script), "gpu0")
    )
    runner.prepare()
    for _ in range(3):
        runner.round()
    m = runner.finish()
    assert m.gpu_busy_seconds is not None and len(m.round_clocks) == 3
    assert m.clocks["sm_mhz"] == 1980 and m.clocks["traced_sm_mhz"] == 1620 and m.clocks["rounds"] == 3
    entry = Entry.from_measurement(m, precision="fp32", cpu_model=None)
    assert Entry.from_json(entry.to_json(), "here").clocks["traced_sm_mhz"] == 1620


def busy_against(busy: float, clocks_now: dict, base_busy: float, base_clocks: dict) -> dict[str, checks.Check]:
    """The tokens/s and GPU busy checks of a GPU run against a baseline with the same tokens/s and these busy times
    and clocks."""
    now = Entry(
        tokens_per_s=1000.0,
        tokens_per_s_iqr=1.0,
        peak_allocated_bytes=10,
        peak_reserved_bytes=10,
        loss=1.0,
        loss_step=5,
        clocks=clocks_now,
        gpu_busy_seconds=busy,
    )
    before = dataclasses.replace(now, clocks=base_clocks, gpu_busy_seconds=base_busy)
    verdict = verdicts.verdict_of("c", now, before, Tolerances.default_for("cuda"))
    return {c.metric: c for c in verdict.checks}


def test_the_busy_time_is_compared_at_the_clock_its_traced_step_ran_at():
    """Kernels run slower at a lower clock: a busy time traced more than CLOCK_TOL below its baseline's traced clock
    is not gated, whatever the rounds ran at; one traced at the baseline's clock is gated even where the rounds'
    clocks moved (tokens/s is not compared then). Where either side has no traced clock (an entry recorded before
    it was sampled), the rounds' clocks stand for it, as before."""
    same = {"sm_mhz": 1980, "traced_sm_mhz": 1980}
    slower = busy_against(0.0352, {"sm_mhz": 1980, "traced_sm_mhz": 1700}, 0.0320, same)  # +10%
    assert slower[verdicts.GPU_BUSY].status == checks.NOT_GATED
    assert slower[verdicts.GPU_BUSY].note == "traced at other clocks (SM 1,700 vs 1,980 MHz)"
    assert slower["tokens/s"].status == checks.OK  # the rounds held their clock
    rounds_moved = busy_against(0.0352, {"sm_mhz": 1700, "traced_sm_mhz": 1980}, 0.0320, same)
    assert rounds_moved["tokens/s"].status == checks.NOT_GATED
    assert rounds_moved["tokens/s"].note == "run at other clocks (SM 1,700 vs 1,980 MHz)"
    assert rounds_moved[verdicts.GPU_BUSY].status == checks.FAIL  # its kernels ran at the same clock: +10% is theirs
    old = busy_against(0.0352, {"sm_mhz": 1980, "traced_sm_mhz": 1700}, 0.0320, {"sm_mhz": 1980})
    assert old[verdicts.GPU_BUSY].status == checks.FAIL  # no traced clock in the baseline: the rounds' held
    old = busy_against(0.0352, {"sm_mhz": 1700}, 0.0320, same)
    assert old[verdicts.GPU_BUSY].note == "run at other clocks (SM 1,700 vs 1,980 MHz)"


def test_a_run_at_other_clocks_is_not_compared_for_speed():
    speed = speed_against(700.0, 1410, 1000.0, 1980)
    assert speed.status == checks.NOT_GATED and speed.note == "run at other clocks (SM 1,410 vs 1,980 MHz)"
    same = speed_against(700.0, 1965, 1000.0, 1980)  # within 5%: the same clocks, a real slowdown
    assert same.status == checks.FAIL
    # the edge, CLOCK_TOL = 5% of the baseline's 1,980 MHz (1,881): 4.5% below compares, 5.6% below does not
    assert checks.CLOCK_TOL == 0.05
    assert speed_against(700.0, 1890, 1000.0, 1980).status == checks.FAIL
    assert speed_against(700.0, 1870, 1000.0, 1980).status == checks.NOT_GATED


def test_a_slower_run_at_a_higher_clock_is_compared():
    """The H200 at its power cap ran the compiled ladder rungs at 1830-1875 MHz and bf16 eager at 1980: code that
    lost its compilation runs 2.7x slower at a clock 6.5% higher, which must fail, not pass as "other clocks"."""
    assert speed_against(116_769.0, 1980, 320_499.0, 1860).status == checks.FAIL


def test_without_nvml_nothing_is_sampled(monkeypatch):
    assert clocks.open_clocks(SimpleNamespace(type="cpu")) is None
    monkeypatch.setattr(clocks, "load_nvml", lambda: None)
    assert clocks.open_clocks(SimpleNamespace(type="cuda", index=0)) is None

    def broken():
        raise RuntimeError("NVML Shared Library Not Found")

    nvml = SimpleNamespace(nvmlInit=broken)
    assert clocks.open_clocks(SimpleNamespace(type="cuda", index=0), nvml) is None


def test_each_slowdown_reason_flags_a_round_by_its_name_and_the_other_reasons_do_not():
    """NVML's clock-event bits (nvml.h, nvmlClocksEventReason*): hardware slowdown 0x08, software thermal 0x20,
    hardware thermal 0x40 and the hardware power brake 0x80 are a GPU slowing itself down; idle 0x01, the
    application-clock setting 0x02, the software power cap 0x04, sync boost 0x10 and the display clock 0x100 are not.
    The SM clock is flagged strictly below 75% of the default, 1,485 of 1,980 MHz is not, 1,484 is, unless the power
    cap holds it there."""
    watch = clocks.Clocks(fake_nvml([]), "gpu0")

    def flag(sm: int, reasons: int) -> str | None:
        return watch.flag(reading(sm, reasons=reasons))

    slowdowns = {0x08: "hardware slowdown", 0x20: "thermal (software)", 0x40: "thermal (hardware)"}
    slowdowns[0x80] = "power brake (hardware)"
    for bit, name in slowdowns.items():
        assert flag(1980, bit) == name
    for bit in (0x01, 0x02, 0x04, 0x10, 0x100):
        assert flag(1980, bit) is None
    assert flag(1485, 0) is None
    assert flag(1484, 0x08 | 0x40) == "SM clock 1484 MHz < 75% of 1980; hardware slowdown; thermal (hardware)"
    assert flag(1484, 0x04) is None  # the power cap's clock: the work's own
    assert flag(1484, 0x08 | 0x40 | 0x04) == "hardware slowdown; thermal (hardware)"  # a slowdown flags it still


def test_an_older_nvidia_ml_py_is_read_through_its_throttle_reasons_call():
    """NVML as of the R525 drivers has only nvmlDeviceGetCurrentClocksThrottleReasons; later releases renamed it
    nvmlDeviceGetCurrentClocksEventReasons and deprecated the old name. Either is read."""
    nvml = fake_nvml([HOT])
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = nvml.nvmlDeviceGetCurrentClocksEventReasons
    del nvml.nvmlDeviceGetCurrentClocksEventReasons
    watch = clocks.Clocks(nvml, "gpu0")
    assert watch.flag(watch.sample()) == "thermal (hardware)"


def test_the_gpu_is_found_by_its_uuid_and_by_its_index_when_nvml_cannot_find_the_uuid(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES=3, CUDA's device 0 is NVML's GPU 3: the handle comes from the device's UUID
    ("GPU-" and torch's uuid, as nvidia-smi -L prints it). Where NVML cannot look it up (an NVMLError of its own
    type), the index is taken; a device without an index is the current one."""
    import torch

    class NVMLError(Exception):
        pass

    uuids = {"GPU-5f0c1e2a": "nvml-gpu3"}

    def by_uuid(uuid: str):
        if uuid not in uuids:
            raise NVMLError("Not Found")
        return uuids[uuid]

    nvml = fake_nvml([])
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetHandleByIndex = lambda index: f"nvml-index{index}"
    props = {0: SimpleNamespace(uuid="5f0c1e2a"), 1: SimpleNamespace(uuid="unknown-to-nvml")}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props[index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert clocks.open_clocks(SimpleNamespace(type="cuda", index=0), nvml).handle == "nvml-gpu3"
    assert clocks.open_clocks(SimpleNamespace(type="cuda", index=None), nvml).handle == "nvml-index1"


def test_the_recorded_clocks_are_the_medians_of_the_kept_rounds_and_the_hottest_of_all():
    """The medians describe the rounds whose speed counts; the hottest temperature is the whole run's, flagged
    rounds included (a throttled round is the hot one); when every round was flagged, all of them are described."""
    rounds = [reading(1980, mem=2619, temp=70, power=600.0), reading(1200, mem=1593, temp=89, power=350.0)]
    rounds += [reading(1950, mem=2600, temp=72, power=640.0), reading(1300, mem=1593, temp=88, power=360.0)]
    rounds += [reading(1965, mem=2610, temp=71, power=620.0)]
    assert clocks.summary(rounds, [1, 3], DEFAULT_SM) == {
        "sm_mhz": 1965,
        "mem_mhz": 2610,
        "default_sm_mhz": DEFAULT_SM,
        "temperature_c_max": 89,
        "power_w_median": 620.0,
        "flagged_rounds": 2,
        "rounds": 5,
    }
    every = clocks.summary(rounds, [0, 1, 2, 3, 4], DEFAULT_SM)
    described = (every["sm_mhz"], every["mem_mhz"], every["power_w_median"], every["flagged_rounds"])
    assert described == (1950, 2600, 600.0, 5)
