"""README.md is the front door: CI runs exactly its set-up and test commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parent.parent


def readme_block(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    install, test = readme_block("Set up and test")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install in ci and test in ci
    assert ci.index(install) < ci.index(test)
    assert install.startswith("pip install torch==2.13.0")  # the CPU wheel before anything that needs torch


def test_the_main_job_is_the_gpu_tier_with_compare():
    assert readme_block("The main job")[0].startswith("pytest bench -m gpu --benchmark-compare")
