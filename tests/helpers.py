"""Small shared builders for the CPU tests: a tiny model, fixed batches, gradient capture."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptcore.config import CHAR_VOCAB, GPTConfig, Recipe
from gptcore.measure import timing
from gptcore.training.data import TokenBatches, load_corpus
from gptcore.training.trainer import Trainer

#: 2 layers x 2 heads x 32 wide, T=16, batch 8: a full step takes a few ms on CPU.
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=CHAR_VOCAB, batch_size=8)

F32_EPS = torch.finfo(torch.float32).eps


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
    """Every timed round from now on reports ``share`` of the CPU (the StepTimer faked): a test whose assertion
    needs a speed figure must not depend on how busy the machine is (below 0.9 a CPU speed is not recorded)."""
    exit_ = timing.StepTimer.__exit__

    def faked(self, *exc):
        exit_(self, *exc)
        self.cpu_share = share

    monkeypatch.setattr(timing.StepTimer, "__exit__", faked)
