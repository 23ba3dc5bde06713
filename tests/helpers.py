"""Small shared builders for the CPU tests: a tiny model, fixed batches, gradient capture."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from gptcore.config import CHAR_VOCAB, GPTConfig, Recipe
from gptcore.measure import timing
from gptcore.measure.timing import torch_threads
from gptcore.plugin.options import THREADS_ENV
from gptcore.training.data import TokenBatches, load_corpus
from gptcore.training.trainer import Trainer

#: 2 layers x 2 heads x 32 wide, T=16, batch 8: a full step takes a few ms on CPU.
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=CHAR_VOCAB, batch_size=8)

F32_EPS = torch.finfo(torch.float32).eps
#: What tells a pytest run it is an xdist worker, or adds options to it.
XDIST_VARIABLES = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID", "PYTEST_ADDOPTS")


def batches(n: int, cfg: GPTConfig = TINY, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` fixed full batches of shakespeare for ``cfg``."""
    data = TokenBatches(load_corpus("shakespeare"), "train", cfg.batch_size, cfg.block_size, seed)
    return [data[i] for i in range(n)]


def trainer(recipe: Recipe, cfg: GPTConfig = TINY, dtype: torch.dtype = torch.float32, **fields) -> Trainer:
    return Trainer(dataclasses.replace(cfg, **fields) if fields else cfg, recipe, "cpu", dtype=dtype)


def capture_grads(t: Trainer) -> list[list[torch.Tensor]]:
    """Record a copy of every gradient just before each optimizer step (ordinary optimizers only). A parameter
    with no gradient is recorded as None, so that a proof comparing gradients fails on it ('None mismatch ... item
    [i]') instead of crashing inside the optimizer's hook."""
    seen: list[list[torch.Tensor | None]] = []
    params = list(t.model.parameters())
    t.optimizers[0].register_step_pre_hook(
        lambda *_: seen.append([None if p.grad is None else p.grad.clone() for p in params])
    )
    return seen


def params(t: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.model.parameters()]


def fake_share(monkeypatch: pytest.MonkeyPatch, share: float) -> None:
    """Every timed round from now on reports ``share`` of the CPU (the StepTimer faked), and the calibration kernel
    timed before each round the same time: a test whose assertion needs a speed figure must not depend on how busy
    the machine is (below 0.9 of the CPU, or with the kernel 10% off its median, a CPU speed is not recorded)."""
    from gptcore.measure import runner

    exit_ = timing.StepTimer.__exit__

    def faked(self, *exc):
        exit_(self, *exc)
        self.cpu_share = share

    monkeypatch.setattr(timing.StepTimer, "__exit__", faked)
    monkeypatch.setattr(runner, "calibration_kernel", lambda: 1e-3)


def run_pytest(workdir: Path, *args: str) -> pytest.RunResult:
    """``pytest ARGS`` run inside this test process from ``workdir``, with one thread as a benchmark child of the
    tests has: torch, dynamo and gptcore are imported once per worker instead of once per run (a child process
    spends ~6 s importing them before its first step). Not pytester: its end unloads every module the run
    imported, and torch's cannot be imported twice. A plugin that patches gptcore for a run (``-p``) must undo
    its patch in ``pytest_unconfigure``."""
    out, err = io.StringIO(), io.StringIO()
    start, cwd = time.perf_counter(), os.getcwd()
    # the run must not think it is an xdist worker (benchmarks skip themselves there, and so does pytest-benchmark)
    hidden = {key: os.environ.pop(key) for key in XDIST_VARIABLES if key in os.environ}
    os.chdir(workdir)
    try:
        with torch_threads(1), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with pytest.MonkeyPatch.context() as patch:  # the CPU cases too (--bench-threads' default)
                patch.setenv(THREADS_ENV, "1")
                ret = pytest.main([*args, f"--basetemp={workdir / 'basetemp'}"])
    finally:
        os.chdir(cwd)
        os.environ.update(hidden)
    return pytest.RunResult(ret, out.getvalue().splitlines(), err.getvalue().splitlines(), time.perf_counter() - start)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m gptcore ARGS`` inside this test process: its exit code and what it printed."""
    from gptcore.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(["gptcore", *args], code, out.getvalue(), err.getvalue())


def needs_matplotlib() -> None:
    """The report's figures need matplotlib (the dev and plot extras, which CI installs): a failure naming the install
    where it is missing, never a skip, which would pass every page test on a broken install."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail(
            "matplotlib is not installed: pip install -e '.[dev]' (the report's figures need it)", pytrace=False
        )
