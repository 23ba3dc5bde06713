"""The style written in pyproject.toml ([tool.ruff]) is the style of the code: `ruff check` and `ruff format --check`
are clean over the whole repository. And the oldest Python that pyproject.toml admits (requires-python) can run it:
vermin finds the minimum version each construct and standard-library name needs (ruff's target-version only shapes
its rewrites; it does not flag ``enum.StrEnum`` on a 3.10 target, which once broke every gate import on 3.10)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # ruff is a dev dependency (pyproject.toml); a missing ruff fails here rather than skipping the check
    return subprocess.run([sys.executable, "-m", "ruff", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_ruff_check_is_clean():
    out = ruff("check", "--no-cache", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_is_clean():
    out = ruff("format", "--check", "--no-cache", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_style_check_catches_a_relative_import_and_a_long_line(tmp_path):
    # planted in a temp tree with this repository's config, never in gptcore
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("from . import other\n\nX = '" + "x" * 130 + "'\n")
    out = ruff("check", "--no-cache", "--output-format", "concise", ".", cwd=tmp_path)
    assert out.returncode == 1
    assert "TID252" in out.stdout and "E501" in out.stdout
    assert ruff("format", "--check", "--no-cache", ".", cwd=tmp_path).returncode == 1  # single quotes


def python_floor() -> str:
    """requires-python's floor, "3.10" of ">=3.10" (read as text: tomllib needs Python 3.11, the floor itself)."""
    found = re.search(r'^requires-python\s*=\s*">=\s*(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml: requires-python is not of the form '>=X.Y'"
    return found.group(1)


NOT_OURS = {"build", "dist", "node_modules", "site-packages"}
"""Top-level folders of a checkout whose Python is not the project's (ruff leaves them out by default too)."""


def python_sources(root: Path) -> list[str]:
    """Every Python file of the tree's own: its top-level .py files and folders, less hidden ones (.venv, the GPU's
    carried files), the install's egg-info, build output and any virtual environment (``python -m venv venv`` in the
    checkout: its packages need newer Pythons than the project's floor)."""
    return sorted(
        p.name
        for p in root.iterdir()
        if not p.name.startswith(".")
        and not p.name.endswith(".egg-info")
        and p.name not in NOT_OURS
        and not (p / "pyvenv.cfg").exists()
        and (p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py"))))
    )


def vermin(root: Path, floor: str) -> subprocess.CompletedProcess:
    # vermin is a dev dependency (pyproject.toml); its entry point is vermin.main (it has no __main__)
    command = "import sys, vermin; sys.exit(vermin.main())"
    args = [f"--target={floor}-", "--violations", "--no-tips", "--no-config-file", *python_sources(root)]
    return subprocess.run([sys.executable, "-c", command, *args], capture_output=True, text=True, timeout=300, cwd=root)


def test_the_code_needs_no_python_newer_than_requires_python():
    assert {"gptcore", "bench", "scripts", "tests", "conftest.py"} <= set(python_sources(ROOT))
    out = vermin(ROOT, python_floor())
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_python_floor_check_catches_a_name_of_a_newer_python(tmp_path):
    # planted in a temp tree, never in gptcore: a 3.11 name on a 3.10 floor, beside a 3.11 module behind a version
    # test (as tests/test_install.py takes tomllib; a bare try/except ImportError is flagged)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("import enum\n\n\nclass Status(enum.StrEnum):\n    OK = 'ok'\n")
    guarded = "import sys\n\nif sys.version_info >= (3, 11):\n    import tomllib\nelse:\n    import tomli as tomllib\n"
    (tmp_path / "pkg" / "toml.py").write_text(guarded)
    out = vermin(tmp_path, "3.10")
    assert out.returncode != 0
    assert "enum.StrEnum" in out.stdout and "mod.py" in out.stdout and "toml.py" not in out.stdout
    (tmp_path / "pkg" / "mod.py").unlink()
    assert vermin(tmp_path, "3.10").returncode == 0
    # a virtual environment made in the checkout is not the project's code: its 3.11 names are not looked at
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "venv" / "lib" / "dep.py").write_text("import tomllib\n")
    assert python_sources(tmp_path) == ["pkg"] and vermin(tmp_path, "3.10").returncode == 0
