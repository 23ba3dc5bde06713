"""Bad input to scripts/trace_cost.py, scripts/calibrated_spread.py and scripts/profile_step.py: one line and exit
code 2, before any step is trained."""

from __future__ import annotations

import pytest

from scripts import calibrated_spread, profile_step, trace_cost

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("pairs", ["0", "-1"])
def test_trace_cost_refuses_fewer_than_one_pair(capsys, pairs):
    assert trace_cost.main(["--pairs", pairs]) == 2
    assert capsys.readouterr().err == "trace_cost: --pairs must be at least 1\n"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--model", "nope"], "calibrated_spread.py: model: unknown 'nope'; choose from "),
        (["--recipe", "nope"], "calibrated_spread.py: recipe: unknown 'nope'; choose from "),
        (["--json", "/"], "calibrated_spread.py: --json /: is a folder; give a file this run can write"),
    ],
)
def test_calibrated_spread_bad_input_is_one_line_and_exit_2(capsys, args, says):
    with pytest.raises(SystemExit) as stop:
        calibrated_spread.main(["--runs", "2", *args])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1


def test_profile_step_refuses_a_negative_warmup(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        profile_step.main(["--model", "cpu-small", "--recipe", "fp32", "--warmup", "-1", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "profile_step: --warmup must be 0 or more, got -1\n"
