"""The CPU peak of a case: the CPU allocator's count over its first steps (:mod:`gptcore.memory.allocator`), with
the storage tracker's breakdown beside it where the recipe is eager.

The figure is the bytes of the model's state at the start of the steps (parameters, buffers, gradients, optimizer
state, counted as the tracker counts them) plus the allocator's rise above its count at that moment. It sees
compiled code, a kernel's scratch and the Python numbers autograd keeps, which the tracker cannot; the breakdown
names what the allocator counted beyond the tracker's peak "untracked", and a compiled step's bytes beyond its
parameters and buffers "compiled step". Several ranks of one torchrun job keep the tracker's peak (``cpu_peak``):
there the allocator would also count the backend's own buffers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gptcore.config import GPTConfig, Recipe
from gptcore.memory import allocator
from gptcore.memory.categories import BUFFERS, COMPILED_STEP, PARAMETERS, UNTRACKED, PeakReport, ordered
from gptcore.memory.tracker import track_training

TRACKED_STEPS = 2
"""CPU: the steps whose peak is measured, the first of every case (two, so that optimizer state exists during the
second)."""


def measured_steps(
    trainer, steps: int, take_step: Callable[[tuple[torch.Tensor, torch.Tensor]], object] | None = None
) -> tuple[int, dict[str, int], int | None]:
    """CPU: ``steps`` steps of a single-process ``trainer`` (a gptcore Trainer) under the allocator's count, and
    under the tracker too where the recipe is eager, each step's batch made just before it: the peak, its
    breakdown (``explained``) and the bytes the last step left allocated beyond what the one before it left (a
    steady step keeps nothing: more is a leak; None for one step). ``take_step`` takes one step of a batch
    (default: ``trainer.step``)."""
    take = take_step or trainer.step
    after: list[int] = []

    def counted_step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        take(batch)
        after.append(allocator.allocated_bytes())  # what the step left: its outputs, what it kept

    report = None
    with allocator.window(allocator.state_bytes(trainer.model, trainer.optimizers)) as counted:
        if trainer.recipe.compile:
            for _ in range(steps):
                counted_step(trainer.step_batch())
        else:
            report = track_training(trainer, steps, take_step=counted_step)
    kept = after[-1] - after[-2] if len(after) > 1 else None
    return counted.peak_bytes, explained(counted, report, trainer.model), kept


def explained(counted: allocator.Window, report: PeakReport | None, model: torch.nn.Module) -> dict[str, int]:
    """The breakdown of a CPU peak the allocator counted: an eager step's tracked breakdown (``report``), with
    what the allocator counted beyond the tracker's peak as untracked; a compiled step's parameters and buffers,
    and everything else as the compiled step's."""
    if report is None:
        params = allocator.storage_bytes(list(model.parameters()))
        buffers = allocator.storage_bytes(list(model.buffers()))
        return ordered({PARAMETERS: params, BUFFERS: buffers, COMPILED_STEP: counted.peak_bytes - params - buffers})
    by = dict(report.by_category)
    if counted.peak_bytes > report.peak_bytes:
        by[UNTRACKED] = counted.peak_bytes - report.peak_bytes
    return ordered(by)


def cpu_peak(cfg: GPTConfig, recipe: Recipe, steps: int = TRACKED_STEPS) -> PeakReport:
    """Peak live tensor bytes of ``steps`` training steps on CPU, tracked on a fresh Trainer (exact), and what was
    live at it by category: the peak of each rank of a torchrun job, where the allocator would also count the
    backend's buffers."""
    from gptcore.training.trainer import Trainer

    return track_training(Trainer(cfg, recipe, "cpu"), steps=steps)


def cpu_peak_bytes(cfg: GPTConfig, recipe: Recipe, steps: int = TRACKED_STEPS) -> int:
    """The CPU peak a case records (``measured_steps``), on a fresh single-process Trainer: exact."""
    from gptcore.training.trainer import Trainer

    allocator.load()
    return measured_steps(Trainer(cfg, recipe, "cpu"), steps)[0]
