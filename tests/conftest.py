"""Under pytest-xdist, each worker gets an equal share of the cores: two workers with a full thread pool each
would oversubscribe a 2-core machine (OpenMP spins), which made rounds up to 40x slower here. The tests' own
benchmark runs (planted regressions among them) never write the CI job's summary or the PR comment: the variables
that ask for them are dropped here, before any child process starts.

The garbage collector is kept off what lives for the whole run (gptcore.measure.heap): torch, Dynamo, gptcore and the
tests' modules (about 300,000 objects) are frozen once collected, and again after a test when what a worker keeps for
good (inductor's loaded kernels) has grown. A full collection of such a heap takes about 0.25 s here, and a worker
makes hundreds (the cases' ``gc.collect`` and Python's own): ``pytest tests -n 2`` took 339 s without a freeze and
248 s with one after collection, whose 37 s left in the collector the refreeze cuts to 8 s (a 2-core AMD EPYC family 25
model 1)."""

from __future__ import annotations

import os

import pytest
import torch

from gptcore.measure import heap
from gptcore.training.trainer import compile_cache_per_isa

#: Set by GitHub Actions, or by a workflow asking for the gate's markdown (gptcore.plugin.MARKDOWN_ENV).
SUMMARY_VARIABLES = ("GITHUB_STEP_SUMMARY", "GPTCORE_GATE_MARKDOWN")


def pytest_configure(config) -> None:
    for name in SUMMARY_VARIABLES:
        os.environ.pop(name, None)
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
    compile_cache_per_isa()  # the compile tests call torch.compile themselves, not only through a Trainer


@pytest.hookimpl(tryfirst=True)  # before gptcore's plugin, which then leaves the heap to this run
def pytest_collection_finish(session) -> None:
    import torch._dynamo  # noqa: F401  (every torch optimizer imports it on its first step: frozen with the rest)

    heap.freeze()


def pytest_runtest_logfinish(nodeid, location) -> None:
    heap.refreeze_if_grown()
