"""Under pytest-xdist, each worker gets an equal share of the cores: two workers with a full thread pool each
would oversubscribe a 2-core machine (OpenMP spins), which made rounds up to 40x slower here."""

from __future__ import annotations

import os

import torch


def pytest_configure(config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
