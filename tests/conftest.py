"""Under pytest-xdist, each worker gets an equal share of the cores: two workers with a full thread pool each
would oversubscribe a 2-core machine (OpenMP spins), which made rounds up to 40x slower here. The tests' own
benchmark runs (planted regressions among them) never write the CI job's summary or the PR comment: the variables
that ask for them are dropped here, before any child process starts."""

from __future__ import annotations

import os

import torch

#: Set by GitHub Actions, or by a workflow asking for the gate's markdown (gptcore.plugin.MARKDOWN_ENV).
SUMMARY_VARIABLES = ("GITHUB_STEP_SUMMARY", "GPTCORE_GATE_MARKDOWN")


def pytest_configure(config) -> None:
    for name in SUMMARY_VARIABLES:
        os.environ.pop(name, None)
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
