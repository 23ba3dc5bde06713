"""scripts/batch_sweep.py on CPU: each batch is its own case of the suite's measurement, in the order given, written
as it ends; bad input is one line and exit 2. What it is for, the GPU's clocks at each batch, only a GPU can show."""

from __future__ import annotations

import json

import pytest

from scripts import batch_sweep


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
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, says):
    with pytest.raises(SystemExit) as stop:
        batch_sweep.main(["--model", "cpu-small", "--device", "cpu", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
