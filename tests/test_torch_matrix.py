"""scripts/torch_matrix.py's pure parts: the tables built from two versions' pytest-benchmark JSON, and bad input as
one line with exit code 2 (no venv made, nothing installed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "torch_matrix.py"


def load_script():  # (the script's module)
    spec = importlib.util.spec_from_file_location("torch_matrix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


matrix = load_script()


def run(torch: str, forward_empty: int, *, loss: float = 3.84913561234) -> dict:
    """A pytest-benchmark JSON of one checkpointed case: ``forward_empty`` aten.empty.memory_format calls in the
    forward, one allocation each."""
    work = {
        "flops": {"forward": 1_000_000, "backward": 2_000_000, "optimizer": 50_000},
        "op_calls": {"forward": 100 + forward_empty, "backward": 200, "optimizer": 10},
        "ops": {
            "forward": {"aten.mm.default": 100, "aten.empty.memory_format": forward_empty},
            "backward": {"aten.mm.default": 200},
            "optimizer": {"aten._foreach_add_.List": 10},
        },
        "syncs": 0,
        "allocations": 300 + forward_empty,
        "allocated_bytes": 5_000_000,
    }
    info = {
        "model": "cpu-small",
        "recipe": "checkpoint",
        "cpu_model": "AMD EPYC (family 25, model 1)",
        "work": work,
        "peak_allocated_bytes": 20_625_408,
        "loss": loss,
        "tokens_per_s": 1234.5,
    }
    return {
        "machine_info": {"torch": torch, "cpu_model": "AMD EPYC (family 25, model 1)"},
        "benchmarks": [
            {"name": "test_cpu_recipes[cpu-small-checkpoint]", "extra_info": info},
            {"name": "test_not_ours", "extra_info": {}},
        ],
    }


def test_one_table_per_case_with_the_versions_side_by_side_and_the_operators_that_moved() -> None:
    text = matrix.tables({"2.11.0": run("2.11.0+cu130", 16), "2.13.0": run("2.13.0+cpu", 8)})
    lines = text.splitlines()
    assert lines[0].split() == ["cpu-small-checkpoint", "torch", "2.11.0", "torch", "2.13.0"]
    rows = {line.split("  ")[0]: line.split()[-2:] for line in lines[2:]}
    assert rows["torch"] == ["2.11.0+cu130", "2.13.0+cpu"]
    assert "AMD EPYC (family 25, model 1)" in lines[3] and lines[3].count("family 25") == 2
    assert rows["FLOPs"] == ["3,050,000", "3,050,000"]
    assert rows["op calls"] == ["326", "318"]
    assert rows["allocations"] == ["316", "308"]
    assert rows["loss"] == ["3.8491356", "3.8491356"]  # 7 decimals
    assert "20,625,408 B (19.67 MiB)" in next(line for line in lines if line.startswith("peak memory"))
    # only the operator whose op calls differ, with its count under each version
    assert rows["op calls: aten.empty.memory_format"] == ["16", "8"]
    assert not any("aten.mm.default" in line for line in lines)


def test_the_same_op_calls_say_same_and_a_case_missing_in_one_version_says_na() -> None:
    only_new = run("2.15.0+cu130", 8)
    only_new["benchmarks"][0]["extra_info"]["recipe"] = "fp32"
    text = matrix.tables(
        {
            "2.13.0": run("2.13.0+cpu", 8),
            "2.15.0": run("2.15.0+cu130", 8)
            | {"benchmarks": run("2.15.0+cu130", 8)["benchmarks"] + only_new["benchmarks"][:1]},
        }
    )
    first, second = text.split("\n\n")
    assert "op calls by operator" in first and first.splitlines()[-1].split()[-2:] == ["same", "same"]
    assert second.splitlines()[0].split()[0] == "cpu-small-fp32"
    assert second.splitlines()[2].split()[-2:] == ["n/a", "2.15.0+cu130"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--torch", "2.x"], "--torch '2.x': not a torch version (like 2.13.0)"),
        (["--torch", "2.13.0", "--json-dir", "{file}"], "--json-dir {file}: not a folder"),
        (["--torch", "2.13.0", "--json-dir", "{file}/sub"], "--json-dir {file}/sub: cannot create it: Not a directory"),
        (["--torch", "2.13.0", "--venvs", "{file}"], "--venvs {file}: not a folder"),
        (["--torch", "2.13.0", "-k", "cpu-small and ("], "-k 'cpu-small and (': not a pytest -k expression: expected"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    """Refused before any venv is made or any case runs (a venv folder or --json-dir that is a file among them)."""
    venvs, file = tmp_path / "venvs", tmp_path / "a-file"
    file.write_text("")
    args = [arg.format(file=file) for arg in args]
    assert matrix.main(["--venvs", str(venvs), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torch_matrix: {says.format(file=file)}") and err.count("\n") == 1
    assert not venvs.exists() or not list(venvs.iterdir())  # no venv made


def test_a_version_pip_cannot_install_is_pips_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        calls.append((cmd, kwargs["env"]["PIP_CONFIG_FILE"]))
        stderr = (
            "Looking in links: /opt/wheels\nERROR: Could not find a version that satisfies the requirement\n"
            "ERROR: No matching distribution found for torch==9.9.9\n"
        )
        return subprocess.CompletedProcess(cmd, 1, stdout=None, stderr=stderr)

    monkeypatch.setattr(matrix.subprocess, "run", fake_run)
    with pytest.raises(matrix.MatrixError) as err:
        matrix._pip(Path("venv/bin/python"), "torch==9.9.9", what="torch 9.9.9")
    assert str(err.value) == (
        "torch 9.9.9: pip could not install it: ERROR: No matching distribution found for torch==9.9.9"
    )
    # pip's configuration files lifted for this one command (the machine-wide cap on torch among them)
    assert calls == [
        (["venv/bin/python", "-m", "pip", "install", "--progress-bar", "off", "torch==9.9.9"], "/dev/null")
    ]


def test_the_script_itself_says_bad_input_in_one_line() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--torch", "two"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["torch_matrix: --torch 'two': not a torch version (like 2.13.0)"]


def test_a_compiled_case_shows_its_graphs_breaks_recompiles_and_kernels() -> None:
    old, new = run("2.11.0+cu130", 8), run("2.13.0+cpu", 8)
    for data, kernels in ((old, 129), (new, 159)):
        data["benchmarks"][0]["extra_info"]["work"]["compile"] = {
            "graphs": 1,
            "graph_breaks": 0,
            "recompiles": 0,
            "kernels": kernels,
        }
    line = next(
        line for line in matrix.tables({"2.11.0": old, "2.13.0": new}).splitlines() if line.startswith("compiled:")
    )
    assert line.split()[-2:] == ["1/0/0/129", "1/0/0/159"]
    assert "compiled:" not in matrix.tables({"2.13.0": run("2.13.0+cpu", 8)})  # eager cases: no such row
