"""Train a case for its study's whole schedule and read what it learned: the validation loss at fixed points, the
training loss between them, time-to-loss and tokens/s. The convergence tier (``bench/test_convergence_*.py``) and
``python -m gptcore train --eval-every`` both run through :func:`train_and_evaluate`.

The validation loss is ``Trainer.evaluate`` on fixed batches (the same tokens for every recipe and seed), in eval
mode. Training seconds are timed per interval by ``gptcore.measure.timing.StepTimer`` (CUDA events on a GPU, the host
clock on CPU) and exclude the evaluations; a compiled recipe's compile time falls in the first interval.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gptcore.config import GPTConfig, Recipe, Schedule

if TYPE_CHECKING:  # loaded inside the functions: the result type is read by baselines, which must not load torch
    import torch

    from gptcore.training.trainer import Trainer


@dataclass
class Convergence:
    """One training run read at the schedule's evaluation points (step 0, eval_every, ..., steps)."""

    steps: list[int]
    """The evaluation points, in optimizer steps."""
    val_loss: list[float]
    """Validation loss at each point."""
    train_loss: list[float | None]
    """Mean training loss over the steps since the previous point (None at step 0)."""
    seconds: list[float]
    """Training seconds up to each point (evaluations excluded)."""
    tokens_per_step: int
    target_loss: float | None

    @property
    def final_val_loss(self) -> float:
        return self.val_loss[-1]

    @property
    def tokens_per_s(self) -> float | None:
        return self.steps[-1] * self.tokens_per_step / self.seconds[-1] if self.seconds[-1] > 0 else None

    def time_to_loss(self, target: float | None = None) -> tuple[int, int, float] | None:
        """(steps, tokens, seconds) at the first evaluation at or below ``target`` (default: the schedule's);
        None when the run never got there."""
        target = self.target_loss if target is None else target
        if target is None:
            return None
        for step, loss, seconds in zip(self.steps, self.val_loss, self.seconds):
            if loss <= target:
                return step, step * self.tokens_per_step, seconds
        return None

    @property
    def eval_every(self) -> int:
        return self.steps[1] - self.steps[0] if len(self.steps) > 1 else 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Convergence:
        """A recorded run; ValueError naming ``where`` and the field when the data is not one."""

        def numbers(key: str, types: tuple, nullable_first: bool = False, loss: bool = False) -> list:
            """A non-empty list of numbers >= 0; finite, except a loss, which a diverged run leaves NaN."""
            value = data.get(key) if isinstance(data, dict) else None
            ok = (
                isinstance(value, list)
                and value
                and all(
                    (v is None and nullable_first and i == 0)
                    or (isinstance(v, types) and not isinstance(v, bool) and not v < 0 and (loss or v < math.inf))
                    for i, v in enumerate(value)
                )
            )
            if not ok:
                what = "numbers >= 0 (NaN where the run diverged)" if loss else "finite numbers >= 0"
                raise ValueError(f"{where}: convergence.{key}: expected a non-empty list of {what}, got {value!r}")
            return list(value)

        if not isinstance(data, dict):
            raise ValueError(f"{where}: convergence: must be an object")
        steps = numbers("steps", (int,))
        curves = [
            numbers("val_loss", (int, float), loss=True),
            numbers("train_loss", (int, float), nullable_first=True, loss=True),
            numbers("seconds", (int, float)),
        ]
        if any(len(c) != len(steps) for c in curves):
            raise ValueError(f"{where}: convergence: steps, val_loss, train_loss and seconds differ in length")
        per_step, target = data.get("tokens_per_step"), data.get("target_loss")
        if not isinstance(per_step, int) or isinstance(per_step, bool) or per_step < 1:
            raise ValueError(f"{where}: convergence.tokens_per_step: expected an integer >= 1, got {per_step!r}")
        if target is not None and (
            isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 <= target < math.inf
        ):
            raise ValueError(f"{where}: convergence.target_loss: expected a finite number >= 0 or null, got {target!r}")
        return cls(steps, *curves, tokens_per_step=per_step, target_loss=target)


def schedule_recipe(recipe: Recipe, schedule: Schedule) -> Recipe:
    """The recipe with its cosine decay ending at the schedule's last step (the studies' recipes already do; a
    shortened schedule gets a whole decay of its own)."""
    return dataclasses.replace(recipe, decay_steps=schedule.steps)


def train_and_evaluate(
    trainer: Trainer, schedule: Schedule, on_eval: Callable[[int, float, float | None], None] | None = None
) -> Convergence:
    """Run ``trainer`` for ``schedule.steps`` optimizer steps, evaluating on ``schedule.eval_batches`` fixed batches
    at every evaluation point; ``on_eval(step, val_loss, train_loss)`` is called at each. No host-device sync
    between evaluations: the step losses stay on the device until the interval ends."""
    import torch

    from gptcore.measure.timing import StepTimer

    if trainer.step_count != 0:
        raise ValueError(f"train_and_evaluate needs a fresh Trainer, this one has taken {trainer.step_count} steps")
    out = Convergence(
        steps=[0],
        val_loss=[trainer.evaluate(n_batches=schedule.eval_batches)],
        train_loss=[None],
        seconds=[0.0],
        tokens_per_step=trainer.tokens_per_step,
        target_loss=schedule.target_loss,
    )
    if on_eval:
        on_eval(0, out.val_loss[0], None)
    elapsed, timer = 0.0, StepTimer(trainer.device)
    for point in schedule.eval_steps[1:]:
        with timer:
            losses = [trainer.step() for _ in range(point - trainer.step_count)]
            train = trainer.mean_loss(torch.stack(losses).mean()).item()  # the interval's one sync
        elapsed += timer.seconds
        val = trainer.evaluate(n_batches=schedule.eval_batches)
        out.steps.append(point)
        out.val_loss.append(val)
        out.train_loss.append(train)
        out.seconds.append(elapsed)
        if on_eval:
            on_eval(point, val, train)
    return out


def converge(
    cfg: GPTConfig,
    recipe: Recipe,
    schedule: Schedule,
    device: torch.device | str = "cpu",
    *,
    threads: int | None = None,
    on_eval: Callable[[int, float, float | None], None] | None = None,
) -> Convergence:
    """One case of the convergence tier: a fresh Trainer with the schedule's decay, trained and evaluated on
    ``threads`` intra-op threads (CPU: one per case, so that the run is bit-identical whatever else runs)."""
    from gptcore.measure.timing import torch_threads
    from gptcore.training.trainer import Trainer

    with torch_threads(threads):
        trainer = Trainer(cfg, schedule_recipe(recipe, schedule), device)
        return train_and_evaluate(trainer, schedule, on_eval)
