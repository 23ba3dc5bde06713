"""The style written in pyproject.toml ([tool.ruff]) is the style of the code: `ruff check` and `ruff format --check`
are clean over the whole repository."""

from __future__ import annotations

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
