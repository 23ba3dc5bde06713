"""scripts/batch_sweep.py on CPU: each batch is its own case of the suite's measurement, in the order given, written
as it ends; bad input is one line and exit 2. What it is for, the GPU's clocks at each batch, only a GPU can show."""

from __future__ import annotations

import json

import pytest

from scripts import batch_sweep

pytestmark = pytest.mark.cpu


def test_each_batch_is_measured_at_that_batch_in_order_and_written(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    args = ["--model", "cpu-small", "--recipe", "fp32", "--device", "cpu", "--batches", "4,2"]
    assert batch_sweep.main([*args, "--warmup", "1", "--rounds", "1", "--steps", "1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["recipe"] == "fp32"
    four, two = record["rows"]
    assert (four["batch"], two["batch"]) == (4, 2)
    assert four["error"] is None and two["error"] is None
    assert four["tokens_per_s"] > 0 and two["tokens_per_s"] > 0
    # the batch reached the step: twice the rows hold more activations at the peak (parameters and AdamW's state are
    # the same in both)
    assert four["peak_allocated_bytes"] > two["peak_allocated_bytes"]
    assert four["sm_mhz"] is None and four["busy_ms"] is None and four["cycles_per_token"] is None  # a GPU's
    printed = capsys.readouterr().out
    assert "cpu, torch" in printed and "cycles/token" in printed


@pytest.mark.parametrize(
    "args, says",
    [
        (["--batches", "0,4"], "every batch must be at least 1"),
        (["--batches", "a"], "expected batches such as 32,64,96"),
        (["--batches", "4", "--recipe", "nope"], "recipe: unknown 'nope'"),
        (["--batches", "4", "--rounds", "0"], "--rounds and --steps must be at least 1"),
        (["--batches", "4", "--recipe", "ddp"], "ddp runs under torchrun"),
        (["--batches", "4", "--device", "tpu"], "device: only cpu and cuda are supported, got 'tpu'"),
        (["--batches", "4", "--json", "/"], "--json /: is a folder; give a file this run can write"),
        (  # 3 rows do not split into 2 micro-batches: the recipe's own reason, named for the batch
            ["--batches", "3", "--recipe", "grad-accum-2"],
            "batch_sweep.py: batch 3: grad_accum_steps: 2 does not divide the batch of 3",
        ),
        (["--batches", "4", "--recipe", "ladder-9-liger"], "liger's fused linear cross-entropy: kernels for a CUDA"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, says):
    with pytest.raises(SystemExit) as stop:
        batch_sweep.main(["--model", "cpu-small", "--device", "cpu", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_a_batch_the_recipe_cannot_split_ends_the_sweep_and_keeps_the_rows_before_it(tmp_path, capsys):
    """The script writes each batch's row to --json as it ends, so a sweep cut short keeps what it measured: batch 4
    splits into grad-accum-2's two micro-batches of 2 and is measured; batch 3 does not split, and ends the sweep
    with exit 2 and one line. The file still holds batch 4's row, and only it (one round of one step: kept cheap)."""
    out = tmp_path / "sweep.json"
    args = ["--model", "cpu-small", "--recipe", "grad-accum-2", "--device", "cpu", "--batches", "4,3"]
    with pytest.raises(SystemExit) as stop:
        batch_sweep.main([*args, "--warmup", "1", "--rounds", "1", "--steps", "1", "--json", str(out)])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.err == "batch_sweep.py: batch 3: grad_accum_steps: 2 does not divide the batch of 3\n"
    record = json.loads(out.read_text())
    assert record["recipe"] == "grad-accum-2" and [row["batch"] for row in record["rows"]] == [4]
    (four,) = record["rows"]
    assert four["error"] is None and four["tokens_per_s"] > 0 and four["peak_allocated_bytes"] > 0
    assert len(captured.out.splitlines()) == 1  # batch 4's row, printed as it ended; no end table


def test_a_gpu_row_gives_the_device_cycles_a_token_at_the_traced_steps_clock():
    """ladder-9's H200 entry (B=146, T=1024: 149,504 tokens a step; busy 0.2711474 s; the rounds at 1,620 MHz and
    695.3 W; its peak), with the traced step taken to run at the rounds' clock, as docs/gpu.md's figure takes it (the
    entry predates ``traced_sm_mhz``): 2,938 device cycles a token, which that doc compares with ladder-8's 3,632."""
    from gptcore.measure.measurement import Measurement

    m = Measurement(device="cuda", tokens_per_step=149_504, steps_per_round=5, tokens_per_s=524_929.67)
    m.gpu_busy_seconds, m.peak_allocated_bytes, m.flagged_rounds = 0.2711474, 82_351_640_064, [3]
    m.clocks = {"sm_mhz": 1620.0, "power_w_median": 695.3, "traced_sm_mhz": 1620}
    row = batch_sweep.row_of(146, m)
    assert round(row["cycles_per_token"]) == 2_938
    assert (row["sm_mhz"], row["power_w"], row["traced_sm_mhz"], row["flagged_rounds"]) == (1620.0, 695.3, 1620, [3])
    assert row["busy_ms"] == pytest.approx(271.1474)
    assert "2,938" in batch_sweep.table([row]) and "76.70" in batch_sweep.table([row])  # GiB, as docs/gpu.md says
