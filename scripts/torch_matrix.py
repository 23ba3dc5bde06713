"""Several torch releases side by side: per torch version a venv of its own (made, or reused, under --venvs) with
that torch and this project (editable), a few CPU benchmark cases run there, and one table per case, the versions in
columns: torch, CPU model, the work ledger's totals, peak memory, the loss, and the operators whose op calls differ.

    python scripts/torch_matrix.py --torch 2.11.0 2.13.0 2.15.0 [-k cpu-small-checkpoint] [--venvs DIR]

Each torch is installed with ``PIP_CONFIG_FILE=/dev/null pip install torch==<version>`` (no pip configuration file,
so no machine-wide cap on torch; a version other than a CPU wheel at hand pulls CUDA packages from PyPI, a few GB).
The cases record into a temporary baselines folder (--update-baselines): nothing is gated against the committed
baselines. Bad input (a version pip cannot install, a -k that selects no case) is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_K = "cpu-small-ckpt-fp32 or cpu-small-fp32 or cpu-small-compile"
DEFAULT_VENVS = Path.home() / ".cache" / "gptcore-bench" / "torch-venvs"
VERSION = re.compile(r"\d+\.\d+(\.\d+)?([a-z]+\d+)?(\+[a-z0-9.]+)?")
PROJECT_IMPORTS = "import gptcore, numpy, tabulate, tqdm, pytest, pytest_benchmark, ruptures; print(gptcore.__file__)"


class MatrixError(Exception):
    """Bad input or a step that could not be done: one line, exit code 2."""


# -- the tables (pure) ---------------------------------------------------------------------------------------------


def cases_of(run: dict) -> dict[str, dict]:
    """A pytest-benchmark JSON's gptcore cases by id ('cpu-small-fp32'): their extra_info."""
    infos = [bench.get("extra_info") or {} for bench in run.get("benchmarks", [])]
    return {f"{info['model']}-{info['recipe']}": info for info in infos if info.get("model") and info.get("recipe")}


def op_calls_by_op(work: dict | None) -> dict[str, int]:
    """One step's op calls by operator overload, summed over the phases."""
    total: Counter[str] = Counter()
    for counts in ((work or {}).get("ops") or {}).values():
        total.update(counts)
    return dict(total)


def _bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,} B ({n / 2**20:.2f} MiB)"


def case_table(case: str, columns: list[tuple[str, dict, dict | None]]) -> str:
    """One case's table: a column per (requested version, machine_info, extra_info or None: not measured)."""

    def row(label: str, value: Callable[[dict, dict, dict], str]) -> list[str]:
        """``value(extra_info, its work ledger, machine_info)`` under each version."""
        return [label] + [
            "n/a" if info is None else value(info, info.get("work") or {}, machine) for _, machine, info in columns
        ]

    rows = [
        row("torch", lambda info, work, machine: machine.get("torch") or "n/a"),
        row("CPU model", lambda info, work, machine: info.get("cpu_model") or machine.get("cpu_model") or local_cpu()),
        row("FLOPs", lambda info, work, _: f"{sum((work.get('flops') or {}).values()):,}"),
        row("op calls", lambda info, work, _: f"{sum((work.get('op_calls') or {}).values()):,}"),
        row("allocations", lambda info, work, _: f"{work.get('allocations', 0):,}"),
        row("allocated bytes", lambda info, work, _: _bytes(work.get("allocated_bytes"))),
    ]
    if any(((info or {}).get("work") or {}).get("compile") for _, _, info in columns):
        rows.append(
            row(
                "compiled: graphs/breaks/recompiles/kernels",
                lambda info, work, _: "/".join(
                    str((work.get("compile") or {}).get(k, "-"))
                    for k in ("graphs", "graph_breaks", "recompiles", "kernels")
                ),
            )
        )
    rows += [
        row("peak memory", lambda info, work, _: _bytes(info.get("peak_allocated_bytes"))),
        row("loss", lambda info, work, _: "n/a" if info.get("loss") is None else f"{info['loss']:.7f}"),
    ]
    by_op = [op_calls_by_op(info.get("work")) for _, _, info in columns if info is not None]
    spread = {op: [counts.get(op, 0) for counts in by_op] for counts in by_op for op in counts}
    moved = sorted(
        (op for op, ns in spread.items() if len(set(ns)) > 1), key=lambda op: (min(spread[op]) - max(spread[op]), op)
    )  # the largest difference first
    rows += [
        row(f"op calls: {op}", lambda info, work, _, op=op: f"{op_calls_by_op(work).get(op, 0):,}") for op in moved
    ]
    if not moved:
        rows.append(["op calls by operator", *(["same"] * len(columns))])
    headers = [case] + [f"torch {version}" for version, _, _ in columns]
    return tabulate(rows, headers=headers, disable_numparse=True)


def tables(runs: dict[str, dict]) -> str:
    """One table per case, the requested versions side by side (``runs``: version -> pytest-benchmark JSON)."""
    per_version = {version: cases_of(run) for version, run in runs.items()}
    names = list(dict.fromkeys(case for cases in per_version.values() for case in cases))
    return "\n\n".join(
        case_table(case, [(v, runs[v].get("machine_info") or {}, per_version[v].get(case)) for v in runs])
        for case in names
    )


def local_cpu() -> str:
    """This machine's CPU model (gptcore.identity's string), for a run that did not record one."""
    try:
        from gptcore.identity import cpu_model
    except ImportError:
        return "unknown"
    return cpu_model()


def check_version(text: str) -> str:
    """A torch version as pip takes it after ``torch==``; MatrixError otherwise."""
    if not VERSION.fullmatch(text):
        raise MatrixError(f"--torch {text!r}: not a torch version (like 2.13.0)")
    return text


def check_folder(option: str, path: Path) -> Path:
    """``path``, a folder this run can write into (made here where missing); MatrixError otherwise."""
    if path.exists() and not path.is_dir():
        raise MatrixError(f"{option} {path}: not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise MatrixError(f"{option} {path}: cannot create it: {err.strerror or err}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise MatrixError(f"{option} {path}: not writable")
    return path


def check_expression(expr: str) -> str:
    """A -k expression pytest's own parser takes; MatrixError otherwise (unjudged where pytest is not at hand)."""
    try:
        from _pytest.mark.expression import Expression
    except ImportError:
        return expr
    try:
        Expression.compile(expr)
    except SyntaxError as err:
        raise MatrixError(f"-k {expr!r}: not a pytest -k expression: {err.msg}") from None
    return expr


# -- the venvs and the runs ----------------------------------------------------------------------------------------


def _pip(python: Path, *args: str, what: str) -> None:
    """pip in ``python``'s venv with no pip configuration file; MatrixError with pip's last error line."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--progress-bar", "off", *args],
        env=env,
        stdout=sys.stderr,
        stderr=subprocess.PIPE,
        text=True,
    )
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")] or proc.stderr.splitlines()
        last = errors[-1] if errors else f"exit {proc.returncode}"
        raise MatrixError(f"{what}: pip could not install it: {last}")


def _query(python: Path, code: str) -> str | None:
    """What ``code`` prints under ``python``; None when it fails."""
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/")  # not this checkout
    return proc.stdout.strip() if proc.returncode == 0 else None


def venv_for(version: str, venvs: Path) -> Path:
    """The venv of ``version`` under ``venvs`` (made, or reused when it already has that torch and the project)."""
    folder = venvs / version
    python = folder / "bin" / "python"
    made = not python.exists()
    if made:
        print(f"torch {version}: making {folder}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    installed = _query(python, "import torch; print(torch.__version__)")
    if installed is None or installed.split("+")[0] != version.split("+")[0]:
        print(f"torch {version}: installing into {folder}", file=sys.stderr, flush=True)
        try:
            _pip(python, f"torch=={version}", what=f"torch {version}")
        except MatrixError:
            if made:  # no empty venv left behind for a version pip has not got
                shutil.rmtree(folder, ignore_errors=True)
            raise
    found = _query(python, PROJECT_IMPORTS)
    if found is None or not Path(found).resolve().is_relative_to(ROOT):
        _pip(python, "-e", str(ROOT), what=f"the project ({ROOT}) beside torch {version}")
    return python


def run_cases(python: Path, expr: str, version: str) -> dict:
    """The pytest-benchmark JSON of the CPU cases ``expr`` selects, run under ``python``, recorded into a
    temporary baselines folder."""
    with tempfile.TemporaryDirectory(prefix="torch-matrix-") as tmp:
        out = Path(tmp) / "bench.json"
        proc = subprocess.run(
            [
                str(python),
                "-m",
                "pytest",
                "bench",
                "-m",
                "cpu",
                "-k",
                expr,
                "--benchmark-json",
                str(out),
                "-p",
                "no:cacheprovider",
                "--update-baselines",
                "--baselines-dir",
                str(Path(tmp) / "baselines"),
                "--results-log",
                str(Path(tmp) / "results.jsonl"),
            ],
            cwd=ROOT,
            stdout=sys.stderr,
        )  # stdout: the tables alone
        if proc.returncode == 5:
            raise MatrixError(f"-k {expr!r}: no CPU case selected")
        if not out.exists():
            raise MatrixError(f"torch {version}: pytest exited {proc.returncode} and wrote no benchmark JSON")
        if proc.returncode != 0:
            print(
                f"torch {version}: pytest exited {proc.returncode} (above); the table has what it measured",
                file=sys.stderr,
            )
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", nargs="+", required=True, metavar="VERSION", help="torch versions, e.g. 2.13.0")
    parser.add_argument(
        "--venvs",
        type=Path,
        default=DEFAULT_VENVS,
        metavar="DIR",
        help=f"one venv per version under DIR (default {DEFAULT_VENVS})",
    )
    parser.add_argument(
        "-k", dest="expr", default=DEFAULT_K, help=f"the CPU cases, as pytest -k (default {DEFAULT_K!r})"
    )
    parser.add_argument(
        "--json-dir", type=Path, metavar="DIR", help="also keep each version's benchmark JSON as DIR/torch-VERSION.json"
    )
    args = parser.parse_args(argv)
    try:
        versions = [check_version(v) for v in dict.fromkeys(args.torch)]
        check_expression(args.expr)
        venvs = check_folder("--venvs", args.venvs.expanduser())
        if args.json_dir:
            check_folder("--json-dir", args.json_dir)
        pythons = {v: venv_for(v, venvs) for v in versions}
        runs = {v: run_cases(python, args.expr, v) for v, python in pythons.items()}
        if args.json_dir:
            for v, run in runs.items():
                (args.json_dir / f"torch-{v}.json").write_text(json.dumps(run, indent=1))
    except (MatrixError, OSError, subprocess.SubprocessError) as err:
        print(f"torch_matrix: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torch_matrix: interrupted", file=sys.stderr)
        return 130
    print(tables(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
