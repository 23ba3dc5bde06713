"""Bad input to scripts/trace_cost.py, scripts/calibrated_spread.py, scripts/profile_step.py and the GPU session's
measurement scripts: one line and exit code 2, before any step is trained or any matmul timed (an output that could
not be written was found only at the end, its measurement lost)."""

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
        (["--recipe", "tf32"], "calibrated_spread.py: tf32 is a CUDA tensor-core mode"),  # a traceback in its first run
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


@pytest.mark.parametrize("script", ["matmul_peak", "partition_memory", "profile_step", "memory_snapshot"])
def test_an_output_that_cannot_be_written_is_refused_before_the_measurement(script, tmp_path, monkeypatch, capsys):
    import importlib
    import sys

    import torch

    if script == "memory_snapshot":  # it needs CUDA first (the allocator history is CUDA's)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    option = "--json" if script in ("matmul_peak", "partition_memory") else "--out"
    target = a_file / ("x.json" if option == "--json" else "sub")
    args = ["--device", "cpu"] if script != "memory_snapshot" else []
    if script in ("profile_step", "memory_snapshot"):
        args += ["--model", "cpu-small", "--recipe", "fp32"]
    module = importlib.import_module(f"scripts.{script}")
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *args, option, str(target)])
    with pytest.raises(SystemExit) as stop:
        raise SystemExit(module.main())
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"{script}: {option} {target}: {a_file} is a file, not a folder\n"


@pytest.mark.parametrize("bad", ["recipe", "model.py", "--json", "--profile"])
def test_versus_nanogpt_refuses_before_the_gpu_what_would_stop_it_after_the_rounds(bad, tmp_path, monkeypatch):
    """An unknown recipe, a folder without nanoGPT's model.py, an output it cannot write: each was found after the
    batch fitting, the warm-up or the timed rounds on the GPU; now one line, before CUDA is even looked for."""
    import sys

    from scripts import versus_nanogpt

    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    if bad != "model.py":
        (nanogpt / "model.py").write_text("")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    args = {"recipe": ["--recipe", "nope"], "--json": ["--json", str(tmp_path)], "--profile": []}.get(bad, [])
    if bad == "--profile":
        args = ["--profile", str(a_file / "p.txt")]
    monkeypatch.setattr(sys, "argv", ["versus_nanogpt.py", str(nanogpt), *args])
    with pytest.raises(SystemExit) as stop:
        versus_nanogpt.main()
    said = {
        "recipe": "versus_nanogpt.py: recipe: unknown 'nope'; choose from ",
        "model.py": f"versus_nanogpt.py: no model.py in {nanogpt}: pass a nanoGPT checkout's folder",
        "--json": f"versus_nanogpt.py: --json {tmp_path}: is a folder; give a file this run can write",
        "--profile": f"versus_nanogpt.py: --profile {a_file / 'p.txt'}: {a_file} is a file, not a folder",
    }[bad]
    assert str(stop.value.code).startswith(said)
