"""A study the suite reproduces (Study), its full training run (Schedule) and how its cases are timed (Timing)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from gptcore.config.checks import check, check_counts
from gptcore.config.recipe import Recipe

CPU_THREADS = 2
"""The intra-op threads every case of a CPU study runs on, whatever the machine's cores: ATen's CPU kernels keep
scratch per thread (sdpa's flash attention on CPU: 12,544 B a thread in its forward, 16,512 B in its backward, at
cpu-small's shapes), so a peak that falls inside one moves with the thread count, and the loss moves by an ulp or so.
The CPU baselines were recorded on 2 threads (a 2-core runner's default)."""


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A study's full training run (convergence tier): its length (the cosine decay ends there), evaluations, target."""

    steps: int
    """Optimizer steps of the whole run (nanoGPT's CPU command: 2,000; its char config: 5,000)."""
    eval_every: int
    """Read the validation loss every this many steps (and at step 0 and at the end)."""
    eval_batches: int
    """Fixed validation batches per evaluation (the model's batch size each, the same for every recipe and seed)."""
    target_loss: float | None = None
    """Time-to-loss: the first evaluation at or below this validation loss (None: no target)."""

    def __post_init__(self) -> None:
        check_counts(self, "steps", "eval_every", "eval_batches")
        check(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0, got {self.target_loss}")

    @property
    def eval_steps(self) -> tuple[int, ...]:
        """The steps after which the validation loss is read: 0 (before training), every eval_every, and the last."""
        return tuple(dict.fromkeys((*range(0, self.steps, self.eval_every), self.steps)))


@dataclass(frozen=True)
class Timing:
    """How a study's benchmark cases are timed: warm-up steps (compile and optimizer state happen there), timed rounds,
    and optimizer steps per round."""

    warmup: int
    rounds: int
    steps_per_round: int
    loss_step: int | None = None
    """The optimizer step after which the loss is read, however many rounds are timed (None: the last one)."""
    speed_rounds: int | None = None
    """CPU: the rounds ``--cpu-speed`` times, for a median worth reading; ``rounds`` is what the exact checks need."""
    threads: int | None = None
    """The intra-op threads the case runs on (``CPU_THREADS`` for the CPU studies; None: the process's own)."""

    def on(self, recipe: Recipe, device: str, *, speed: bool = False) -> Timing:
        """The timing of one case: a bf16 case on CPU reads its loss at step 4 (where the study reads step 8), taken
        by one round of one step and then the ledger's step (gptcore.measure.runner: the ledger's step is the loss
        step where the two meet). A CPU without native bf16 (no AVX512-BF16: a Zen 3 EPYC, GitHub's hosted
        runners) emulates bf16 matmuls about 23x slower than fp32, and every check keeps its meaning in fewer
        steps: the peak (the two tracked warm-up steps), the loss (bf16 forward, backward and three optimizer
        updates), the work ledger (one steady step). Speed is not gated on CPU; with ``speed`` (``--cpu-speed``)
        the study's rounds of ``steps_per_round`` steps are timed and the loss is still read at step 4."""
        if device != "cpu" or not recipe.precision.startswith("bf16") or self.loss_step is None:
            return self
        loss_step = self.warmup + self.steps_per_round
        if speed:
            return dataclasses.replace(self, loss_step=loss_step)
        one_step_less = max(1, self.steps_per_round - 1)
        return dataclasses.replace(self, rounds=1, steps_per_round=one_step_less, loss_step=loss_step)


@dataclass(frozen=True)
class Study:
    """One experiment the suite reproduces: which models it varies under which recipes, and where it runs."""

    name: str
    """Its name: the case ids' group and ``python -m gptcore list``'s heading."""
    what: str
    """What it varies, in one line."""
    models: tuple[str, ...]
    """The named models (gptcore.presets.MODELS) it runs."""
    recipes: tuple[str, ...]
    """The named recipes (gptcore.presets.RECIPES) each model runs under."""
    device: Literal["cpu", "cuda"]
    """Where its benchmark cases run: the CPU tier or the GPU tier."""
    schedule: Schedule | None = None
    """The study's full training run (the convergence tier); None where the study has no quality figure."""
    timing: Timing | None = None
    """How its benchmark cases are timed (None: a study with convergence cases only)."""
