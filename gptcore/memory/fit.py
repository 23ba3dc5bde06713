"""The batch that fills the device (``Recipe.fit_memory``): the largest batch whose analytic peak fits a share of
the device's memory. The estimate is monotone in the batch, so doubling then bisecting finds it in about
2 log2(batch) estimates. The seed grew its batch by hand as memory freed (28 -> 48 -> 64); this chooses it."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from gptcore.config import GPTConfig, Recipe
from gptcore.memory.analytic import estimate, resolve


@dataclass(frozen=True)
class Fit:
    """The fitted batch (sequences per optimizer step), its estimated peak and the budget it fits in."""

    batch: int
    peak_bytes: int
    budget_bytes: int


def fit_batch(cfg: GPTConfig, recipe: Recipe, device: str, capacity_bytes: int, share: float | None = None) -> Fit:
    """The largest batch (a multiple of the recipe's gradient accumulation steps) whose estimated peak on ``device``
    is at most ``share`` (default: the recipe's ``fit_memory``) of ``capacity_bytes``. ValueError, naming the
    smallest batch's peak, where even that does not fit."""
    share = recipe.fit_memory if share is None else share
    if share is None or not 0 < share <= 1:
        raise ValueError(f"fit_memory: a share in (0, 1] is needed, got {share!r}")
    budget = int(share * capacity_bytes)
    base, accum = dataclasses.replace(recipe, fit_memory=None, batch_divisor=1), recipe.grad_accum_steps

    @functools.cache  # the fitted batch's peak was estimated on the way; it is read back, not estimated again
    def peak(micro: int) -> int:
        question = resolve(cfg, base, batch=micro * accum, seq=cfg.block_size, device=device)
        return estimate(question).total_bytes

    if (smallest := peak(1)) > budget:
        raise ValueError(
            f"fit_memory: a batch of {accum} already needs an estimated {smallest:,} B, over {share} of "
            f"{capacity_bytes:,} B"
        )
    fits, over = 1, 2
    while peak(over) <= budget:
        fits, over = over, 2 * over
    while over - fits > 1:
        middle = (fits + over) // 2
        fits, over = (middle, over) if peak(middle) <= budget else (fits, middle)
    return Fit(batch=fits * accum, peak_bytes=peak(fits), budget_bytes=budget)


def device_memory(device: str) -> int:
    """The memory a batch may fill: the GPU's (``cuda``: device 0's total), or the host's physical memory (``cpu``).
    ValueError, in one line, for ``cuda`` on a machine with no CUDA GPU."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"fit_memory: the batch that fills the GPU needs the GPU's memory, and torch {torch.__version__} sees "
                f"no CUDA GPU here; give the memory in bytes (estimate --capacity; an H200 has 150,121,545,728)"
            )
        return torch.cuda.get_device_properties(0).total_memory
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fitted(cfg: GPTConfig, recipe: Recipe, device: str, capacity_bytes: int | None = None) -> GPTConfig:
    """``cfg`` with the batch that fills the device (``capacity_bytes``, default ``device_memory(device)``) where the
    recipe asks for it (``fit_memory``); else ``cfg`` itself. The one place a case's fitted batch is chosen: the
    benchmark harness and ``train`` build their Trainer on what it returns."""
    if recipe.fit_memory is None:
        return cfg
    capacity = device_memory(device) if capacity_bytes is None else capacity_bytes
    return dataclasses.replace(cfg, batch_size=fit_batch(cfg, recipe, device, capacity).batch)
