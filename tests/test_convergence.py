"""The convergence tier: its figures (time-to-loss, the recorded run's schema), its gate (the final validation loss
against the seed-to-seed spread, time-to-loss exactly), the CLI's --eval-every, and a planted regression that hurts
learning without changing any figure the benchmark tier reads: the convergence gate fails it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from gptcore import identity
from gptcore.config import Schedule
from gptcore.gate import baselines, schema
from gptcore.gate.schema import BaselineError, Entry, Tolerances
from gptcore.gate.verdicts import verdict_of
from gptcore.measure.convergence import Convergence, converge, schedule_recipe
from gptcore.presets import CPU_SHAPE_SHORT, STUDIES, get_model, get_recipe
from gptcore.training import trainer as train

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parent.parent
SHORT_CASE = "test_convergence_cpu_shape_short[cpu-small+ckpt-fp32]"
# the last step the CPU-shape benchmark case runs, with --cpu-speed's rounds: warm-up, timed rounds, ledger step
CPU_TIMING = STUDIES["cpu-shape"].timing
BENCH_HORIZON = CPU_TIMING.warmup + CPU_TIMING.speed_rounds * CPU_TIMING.steps_per_round + 1


def run(val: list[float], steps: tuple[int, ...] = (0, 100, 200, 300), target: float | None = 2.0) -> Convergence:
    return Convergence(
        steps=list(steps),
        val_loss=val,
        train_loss=[None, *val[1:]],
        seconds=[0.0, 1.0, 2.0, 3.0][: len(steps)],
        tokens_per_step=768,
        target_loss=target,
    )


def entry(c: Convergence, cpu: str = "cpu A") -> Entry:
    return Entry(
        tokens_per_s=1000.0,
        tokens_per_s_iqr=None,
        peak_allocated_bytes=None,
        peak_reserved_bytes=None,
        loss=None,
        loss_step=c.steps[-1],
        cpu_model=cpu,
        convergence=c,
    )


def statuses(now: Entry, before: Entry | None, tol: float = 0.02) -> dict[str, str]:
    verdict = verdict_of("case", now, before, dataclasses.replace(Tolerances.default_for("cpu"), val_loss=tol))
    return {c.metric: c.status for c in verdict.checks}


def test_the_val_loss_tolerance_is_three_standard_deviations_of_a_reseed_as_measured():
    """The tolerance's evidence (scripts/convergence_spread.py): pooled over the cases, the seed-to-seed standard
    deviation of the final validation loss; two runs differ by sqrt(2) of it; the gate allows 3 of those, and
    every measured case's spread (max - min over its seeds) lies within the tolerance."""
    data = json.loads((ROOT / "tests" / "data" / "convergence_spread_cpu.json").read_text())
    finals: dict[tuple, list[float]] = {}
    for r in data["runs"]:
        finals.setdefault((r["schedule"], r["model"], r["recipe"]), []).append(r["val_loss"][-1])
    assert len(finals) == 6 and all(len(v) == 3 for v in finals.values())
    assert {k[2] for k in finals} == {
        "ckpt-fp32",
        "ckpt-half-batch",
        "ckpt-grad-accum-2",
        "ckpt-sgd-cosine",
        "ckpt-bf16",
    }  # fp32, small batch, accumulation, SGD, bf16
    squares = sum((x - sum(v) / len(v)) ** 2 for v in finals.values() for x in v)
    pooled = (squares / sum(len(v) - 1 for v in finals.values())) ** 0.5
    assert schema.VAL_LOSS_TOLERANCE == pytest.approx(3 * pooled * 2**0.5, abs=1e-3)
    assert all(max(v) - min(v) < schema.VAL_LOSS_TOLERANCE for v in finals.values())
    assert Tolerances.default_for("cpu").val_loss == schema.VAL_LOSS_TOLERANCE
    assert baselines.load(ROOT / "baselines" / "cpu.json").tolerances.val_loss == schema.VAL_LOSS_TOLERANCE


def test_the_spread_script_refuses_an_out_it_cannot_write_before_any_run(tmp_path, capsys):
    """scripts/convergence_spread.py writes --out after every run: a folder is one line and exit 2, up front."""
    from scripts import convergence_spread

    with pytest.raises(SystemExit) as stop:
        convergence_spread.main(["--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == f"convergence_spread.py: --out {tmp_path}: is a folder; give a file this run can write\n"


def test_time_to_loss_is_the_first_evaluation_at_or_below_the_target():
    c = run([4.3, 2.5, 2.0, 1.9])
    assert c.time_to_loss() == (200, 200 * 768, 2.0)  # 2.0 <= 2.0: reached at the evaluation that equals it
    assert c.time_to_loss(2.4) == (200, 200 * 768, 2.0)
    assert c.time_to_loss(1.0) is None
    assert run([4.3, 2.5, 2.0, 1.9], target=None).time_to_loss() is None
    assert c.tokens_per_s == 300 * 768 / 3.0


def test_schedule_reads_at_step_zero_every_interval_and_at_the_end():
    assert Schedule(steps=400, eval_every=100, eval_batches=1).eval_steps == (0, 100, 200, 300, 400)
    assert Schedule(steps=250, eval_every=100, eval_batches=1).eval_steps == (0, 100, 200, 250)
    with pytest.raises(ValueError, match="eval_every"):
        Schedule(steps=10, eval_every=0, eval_batches=1)
    with pytest.raises(ValueError, match="eval_batches: must be an integer >= 1, got 0"):  # a mean of no batch
        Schedule(steps=10, eval_every=5, eval_batches=0)
    with pytest.raises(ValueError, match="target_loss: must be > 0, got 0.0"):  # no cross-entropy reaches 0
        Schedule(steps=10, eval_every=5, eval_batches=1, target_loss=0.0)
    assert schedule_recipe(get_recipe("ckpt-fp32"), CPU_SHAPE_SHORT).decay_steps == 200


def test_gate_fails_a_worse_final_val_loss_beyond_the_spread_and_passes_within():
    before = entry(run([4.3, 2.5, 2.0, 1.90]))
    assert statuses(entry(run([4.3, 2.5, 2.0, 1.919])), before)["val loss"] == "ok"  # +0.019 < 0.02
    assert statuses(entry(run([4.3, 2.5, 2.0, 1.921])), before)["val loss"] == "FAIL"  # +0.021
    assert statuses(entry(run([4.3, 2.5, 2.0, 1.879])), before)["val loss"] == "better"  # refresh the baseline
    assert statuses(entry(run([4.3, 2.5, 2.0, 1.9])), None) == dict.fromkeys(
        ("tokens/s", "val loss", "time-to-loss"), "no baseline"
    )


def test_time_to_loss_is_exact_on_the_same_cpu_and_has_one_interval_of_slack_on_another():
    before = entry(run([4.3, 2.5, 2.0, 1.9]))  # reaches 2.0 at step 200
    later = run([4.3, 2.5, 2.01, 1.9])  # at step 300
    assert statuses(entry(later), before)["time-to-loss"] == "FAIL"
    assert statuses(entry(later, cpu="cpu B"), before)["time-to-loss"] == "ok"
    assert statuses(entry(run([4.3, 2.5, 2.01, 2.01])), before)["time-to-loss"] == "FAIL"  # never reached
    assert statuses(entry(run([4.3, 1.99, 1.9, 1.9])), before)["time-to-loss"] == "better"
    moved = entry(run([4.3, 2.5, 2.0], steps=(0, 100, 200)))
    assert statuses(moved, before)["val loss"] == "not gated"  # evaluated at other steps: re-record


def test_a_recorded_run_round_trips_and_a_broken_one_is_named():
    c = run([4.3, 2.5, 2.0, 1.9])
    back = Entry.from_json(json.loads(json.dumps(entry(c).to_json())), "here")
    assert back.convergence == c
    data = entry(c).to_json()
    data["convergence"]["val_loss"] = [4.3, "x", 2.0, 1.9]
    with pytest.raises(BaselineError, match=r"here: convergence.val_loss"):
        Entry.from_json(data, "here")
    data["convergence"]["val_loss"] = [4.3, 2.0]
    with pytest.raises(BaselineError, match="differ in length"):
        Entry.from_json(data, "here")


def test_a_convergence_run_is_bit_identical_when_repeated():
    schedule = Schedule(steps=20, eval_every=10, eval_batches=2, target_loss=3.9)
    a = converge(get_model("cpu-small"), get_recipe("ckpt-fp32"), schedule, threads=1)
    b = converge(get_model("cpu-small"), get_recipe("ckpt-fp32"), schedule, threads=1)
    assert a.val_loss == b.val_loss and a.train_loss == b.train_loss
    assert a.steps == [0, 10, 20] and a.train_loss[0] is None
    assert a.val_loss[-1] < a.val_loss[0]  # it learns


def test_each_evaluation_point_holds_its_own_validation_loss_interval_mean_and_training_seconds(monkeypatch):
    """``train_and_evaluate`` replayed by hand on a twin Trainer: at each point the validation loss is ``evaluate``
    over the schedule's eval_batches (2, not evaluate's default of 10), the training loss is the mean of the
    interval's step losses (2, 2 and 1 steps), and the seconds add up the intervals' timed training and nothing
    else (a timer faked at 1.5, 2.5 and 4 s an interval)."""
    from gptcore.measure import timing
    from gptcore.measure.convergence import train_and_evaluate
    from gptcore.measure.timing import torch_threads
    from tests.helpers import trainer

    intervals = iter([1.5, 2.5, 4.0])

    class Timer:
        def __init__(self, device) -> None:
            self.seconds = 0.0

        def __enter__(self) -> Timer:
            return self

        def __exit__(self, *exc) -> None:
            self.seconds = next(intervals)

    monkeypatch.setattr(timing, "StepTimer", Timer)
    schedule, recipe = Schedule(steps=5, eval_every=2, eval_batches=2), get_recipe("ckpt-fp32")
    with torch_threads(1):
        got = train_and_evaluate(trainer(recipe), schedule)
        twin = trainer(recipe)
        val, mean = [twin.evaluate(n_batches=2)], [None]
        for point in (2, 4, 5):
            losses = [twin.step() for _ in range(point - twin.step_count)]
            mean.append(torch.stack(losses).mean().item())
            val.append(twin.evaluate(n_batches=2))
    assert got.steps == [0, 2, 4, 5]
    assert got.val_loss == val and got.train_loss == mean  # bit for bit: the same steps in the same order
    assert got.seconds == [0.0, 1.5, 4.0, 8.0]
    with pytest.raises(ValueError, match="needs a fresh Trainer, this one has taken 5 steps"):
        train_and_evaluate(twin, schedule)


def test_a_run_on_its_own_thread_count_gives_the_callers_back():
    from gptcore.measure.timing import torch_threads

    before = torch.get_num_threads()
    asked = 2 if before == 1 else 1
    with torch_threads(asked):
        assert torch.get_num_threads() == asked
    assert torch.get_num_threads() == before
    with torch_threads(None):  # None: left as it is
        assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("train_loss", [None, None, 2.0, 1.9], "convergence.train_loss"),  # None at step 0 only: nothing was trained
        ("seconds", [0.0, 1.0, 2.0], "differ in length"),
        ("train_loss", [None, 2.5, 2.0], "differ in length"),
        ("tokens_per_step", 0, "convergence.tokens_per_step: expected an integer >= 1, got 0"),
        ("tokens_per_step", True, "convergence.tokens_per_step"),
        ("target_loss", "2.0", "convergence.target_loss: expected a finite number >= 0 or null"),
        ("target_loss", float("nan"), "convergence.target_loss: expected a finite number >= 0 or null, got nan"),
        ("steps", [0, -1, 2, 3], "convergence.steps: expected a non-empty list of finite numbers >= 0"),
        ("seconds", [0.0, 1.0, float("inf"), 3.0], "convergence.seconds: expected a non-empty list of finite"),
        ("val_loss", [4.3, -2.5, 2.0, 1.9], r"convergence.val_loss: expected a non-empty list of numbers >= 0 \(NaN"),
    ],
)
def test_a_broken_recorded_run_is_named_by_its_field(field, value, match):
    data = entry(run([4.3, 2.5, 2.0, 1.9])).to_json()
    data["convergence"][field] = value
    with pytest.raises(BaselineError, match=match):
        Entry.from_json(data, "here")


def test_a_diverged_run_reads_back_with_its_nan_losses():
    """A run whose loss went NaN keeps its curve (the report draws it up to where it diverged); only a loss below
    zero, which cross-entropy cannot give, is refused."""
    data = entry(run([4.3, 2.5, 2.0, 1.9])).to_json()
    data["convergence"]["val_loss"][2:] = [float("nan")] * 2
    data["convergence"]["train_loss"][3] = float("nan")
    read = Entry.from_json(data, "here").convergence
    assert read.val_loss[:2] == [4.3, 2.5] and all(math.isnan(v) for v in read.val_loss[2:] + read.train_loss[3:])


def test_a_recorded_integer_target_is_a_number():
    data = entry(run([4.3, 2.5, 2.0, 1.9])).to_json()
    data["convergence"]["target_loss"] = 2
    assert Entry.from_json(data, "here").convergence.time_to_loss() == (200, 200 * 768, 2.0)


def test_cli_train_prints_the_validation_loss_every_n_steps_and_the_final_one(capsys):
    from gptcore.cli import main

    assert (
        main(
            [
                "train",
                "--model",
                "cpu-small",
                "--recipe",
                "ckpt-fp32",
                "--steps",
                "5",
                "--eval-every",
                "2",
                "--eval-batches",
                "1",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    evaluated = [line.split(":")[0].split()[-1] for line in (out.out + out.err).splitlines() if ": val loss" in line]
    assert evaluated == ["0", "2", "4", "5"]
    assert "validation loss" in out.out and "at step 5" in out.out


def _early_decay(real):
    """The plant: a schedule whose cosine decay ends at half the recipe's decay_steps (warm-up untouched)."""

    def lr_at(step, recipe):
        return real(step, dataclasses.replace(recipe, decay_steps=recipe.decay_steps // 2))

    return lr_at


@pytest.mark.slow
def test_a_schedule_that_decays_too_early_fails_the_convergence_gate_and_no_benchmark_figure(monkeypatch):
    """The CI convergence case (200 steps) with the cosine decay ending at step 100, where the warm-up ends, instead
    of 200 (the learning rate drops to its minimum at once): every step the CPU-shape benchmark case runs, up to
    step 25 with --cpu-speed's rounds, is unchanged; the final validation loss is worse than the committed baseline
    by more than the seed-to-seed tolerance."""
    cfg, recipe = get_model("cpu-small"), schedule_recipe(get_recipe("ckpt-fp32"), CPU_SHAPE_SHORT)
    real = train.lr_at
    assert BENCH_HORIZON < recipe.warmup_steps  # what the benchmark reads lies inside the warm-up

    # the Trainer reads its learning rate from lr_at(step, recipe) and from nothing else the plant touches: the same
    # rate at every step the benchmark reads is the same step (the planted run below fails, so the plant is read)
    planted_lr = _early_decay(real)
    assert [planted_lr(step, recipe) for step in range(BENCH_HORIZON)] == [
        real(step, recipe) for step in range(BENCH_HORIZON)
    ]
    monkeypatch.setattr(train, "lr_at", planted_lr)

    planted = converge(cfg, get_recipe("ckpt-fp32"), CPU_SHAPE_SHORT, threads=1)
    file = baselines.load(ROOT / "baselines" / "cpu.json", expect_slug="cpu")
    before = file.entries[SHORT_CASE]
    verdict = verdict_of(SHORT_CASE, entry(planted, cpu=identity.cpu_model()), before, file.tolerances)
    val = next(c for c in verdict.checks if c.metric == "val loss")
    assert val.status == "FAIL", val.note
    print(
        f"planted early decay: final val {planted.final_val_loss:.4f} vs baseline "
        f"{before.convergence.final_val_loss:.4f} (+{val.delta:.4f} nats, tolerance {file.tolerances.val_loss})"
    )


def test_the_end_tables_show_a_convergence_case():
    from gptcore.gate.session import Row
    from gptcore.gate.summary import convergence_table, gate_table

    now, before = entry(run([4.3, 2.5, 2.0, 1.93])), entry(run([4.3, 2.5, 2.0, 1.90]))
    verdict = verdict_of("case", now, before, Tolerances.default_for("cpu"))
    row = Row(
        "test_convergence[cpu-small-ckpt-fp32]",
        now,
        before,
        verdict.summary(),
        status={c.metric: c.status for c in verdict.checks},
    )
    main = gate_table([row])
    assert "val 1.9300" in main and "+0.0300" in main and "FAIL: val loss +0.0300 nats" in main
    table = convergence_table([row])
    assert "1.9300 @300" in table and "200 (153,600 tok, 2 s)" in table and "1.9000" in table
