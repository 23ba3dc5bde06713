"""The command line: training runs and the loss falls; bad input is one line and exit code 2, no traceback."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from gptcore.__main__ import main
from gptcore.config import MODELS, RECIPES

pytestmark = pytest.mark.cpu


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptcore", *args], capture_output=True, text=True, timeout=300)


def test_train_runs_and_the_loss_falls():
    out = run_cli("train", "--model", "cpu-small", "--recipe", "fp32", "--steps", "50", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out.stdout).groups())
    assert last < first - 0.3  # measured 3.36 -> 2.64
    assert "tok/s" in out.stdout and "ms/step" in out.stdout


@pytest.mark.parametrize("args,expected", [
    (["train", "--model", "nope"], "choose from char, char-ctx2"),
    (["train", "--model", "cpu-small", "--recipe", "nope"], "choose from fp32"),
    (["train", "--model", "cpu-small", "--recipe", "tf32", "--device", "cpu"], "tf32 is a CUDA"),
    (["train", "--model", "cpu-small", "--recipe", "ladder-5", "--device", "cpu"], "flash attention needs"),
    (["train", "--model", "cpu-small", "--steps", "0"], "--steps must be >= 1"),
    (["train", "--model", "cpu-small", "--batch", "7", "--recipe", "grad-accum"], "grad_accum_steps"),
    (["train"], "required"),
    (["fly"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, expected, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gptcore: error:") and expected in err, err


def test_bad_input_from_the_shell_has_no_traceback():
    out = run_cli("train", "--model", "nope")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_list_names_every_model_and_recipe(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = {line.split()[0] for line in lines if line.strip()}
    assert set(MODELS) <= names and set(RECIPES) <= names
