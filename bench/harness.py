"""What every benchmark case shares: the study's grid with readable ids, a RunIf-style skip helper,
``benchmark_case`` (skip what the device cannot run, time the case with benchmark.pedantic, gate it against
baselines), ``replay_rounds`` (rounds timed elsewhere, as pytest-benchmark's own) and ``converge_case`` (a whole
training run of the convergence tier, gated on what it learned)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from gptcore import memory
from gptcore.config import GPTConfig, Recipe, Schedule, Study, Timing
from gptcore.gate.session import Outcome
from gptcore.measure.convergence import Convergence, converge
from gptcore.measure.measurement import Measurement
from gptcore.measure.runner import cannot_fit, out_of_memory_in, run_case
from gptcore.memory.fit import fitted
from gptcore.presets import MODELS, RECIPES
from gptcore.training.kernels import FP8_CAPABILITY
from gptcore.training.model import attention_capability
from gptcore.training.trainer import unsupported_reason


class BaselineMissing(UserWarning):
    """A benchmark ran but its device's baseline file has no entry for it."""


def run_if(
    *, cuda: bool = False, bf16: bool = False, min_capability: tuple[int, int] | None = None, min_gpus: int = 0
) -> list[pytest.MarkDecorator]:
    """One skipif mark carrying every unmet hardware need (Lightning's RunIf), for
    ``pytest.param(..., marks=run_if(...))``; an empty list when all needs are met."""
    reasons = []
    has_cuda = torch.cuda.is_available()
    if (cuda or bf16 or min_capability or min_gpus) and not has_cuda:
        reasons.append("needs CUDA (torch.cuda.is_available() is False)")
    elif min_gpus and torch.cuda.device_count() < min_gpus:
        reasons.append(f"needs {min_gpus} GPUs, {torch.cuda.device_count()} visible")
    if has_cuda and bf16 and not torch.cuda.is_bf16_supported():
        reasons.append(f"needs bf16 ({torch.cuda.get_device_name()} has none)")
    if has_cuda and min_capability and torch.cuda.get_device_capability() < min_capability:
        reasons.append(f"needs compute capability >= {min_capability[0]}.{min_capability[1]}")
    return [pytest.mark.skipif(True, reason="; ".join(reasons))] if reasons else []


def needs_of(recipe: Recipe, device: str) -> list[pytest.MarkDecorator]:
    """The run_if marks a recipe implies on ``device``: bf16, a pinned attention kernel and FP8 need the right GPU
    (the capabilities are the model's and the kernels' own, which ``unsupported_reason`` checks again at run time)."""
    if device != "cuda":
        return []
    needs = [c for c in (attention_capability(recipe.attention), FP8_CAPABILITY if recipe.kernels.fp8 else None) if c]
    return run_if(cuda=True, bf16=recipe.precision.startswith("bf16"), min_capability=max(needs, default=None))


def grid(study: Study) -> list:
    """pytest.param(model, recipe name) for every case of ``study``, with ids like 'char-ctx2-bf16' (a registered
    model and recipe: ``python -m gptcore train --model char-ctx2 --recipe bf16`` reruns the case) and RunIf marks."""
    return [
        pytest.param(model, name, id=f"{model}-{name}", marks=needs_of(RECIPES[name], study.device))
        for model in study.models
        for name in study.recipes
    ]


def estimate_of(cfg: GPTConfig, recipe: Recipe, device: str) -> tuple[int | str, dict[str, int] | None]:
    """gptcore.memory.estimate's peak for the case's model and its breakdown by category ('err' and None if it
    raised: an estimate column never fails a case)."""
    try:  # batch: the preset's sequences per optimizer step (the estimator applies divisor and accumulation)
        question = memory.resolve(cfg, recipe, batch=cfg.batch_size, seq=cfg.block_size, device=device)
        est = memory.estimate(question)
        return est.total_bytes, dict(est.by_category)
    except Exception:
        return "err", None


def benchmark_case(
    benchmark, gate, request: pytest.FixtureRequest, study: Study, model: str, recipe_name: str, timing: Timing
) -> Measurement:
    """Run one case of ``study`` under benchmark.pedantic and gate it; skip (with the reason) what the device
    cannot run."""
    recipe, device, cfg = RECIPES[recipe_name], study.device, MODELS[model]
    reason = unsupported_reason(recipe, device, cfg)
    if reason:
        pytest.skip(reason)
    speed = bool(gate.cpu_speed and timing.speed_rounds)
    timing = timing.on(recipe, device, speed=speed)
    rounds = timing.speed_rounds if speed else timing.rounds
    warmup, rounds, steps_per_round = gate.timing(timing.warmup, rounds, timing.steps_per_round)
    try:  # the batch that fills the device, where the recipe asks for it (Recipe.fit_memory)
        cfg = fitted(cfg, recipe, device)
    except ValueError as err:
        pytest.skip(str(err))
    estimate, estimate_by_category = estimate_of(cfg, recipe, device)
    reason = cannot_fit(estimate, device)  # a GPU case the estimate says cannot fit: skipped, not an OOM
    if reason:
        pytest.skip(reason)

    def timed_loop(round_fn: Callable[[], None], n: int, between: Callable[[], None]) -> None:
        benchmark.pedantic(round_fn, setup=between, rounds=n, iterations=1, warmup_rounds=0)

    m = run_case(
        cfg,
        recipe,
        device,
        warmup=warmup,
        rounds=rounds,
        steps_per_round=steps_per_round,
        timed_loop=timed_loop,
        loss_step=timing.loss_step,
        threads=gate.cpu_threads if device == "cpu" and gate.cpu_threads else timing.threads,
    )
    outcome = gate.judge(
        request.node,
        m,
        model=model,
        recipe=recipe_name,
        precision=recipe.precision,
        estimate=estimate,
        estimate_by_category=estimate_by_category,
    )
    benchmark.extra_info.update(
        model=model,
        recipe=recipe_name,
        precision=recipe.precision,
        batch=recipe.batch_size(cfg),
        block_size=cfg.block_size,
        estimate_bytes=estimate,
        cpu_model=gate.cpu_model if device == "cpu" else None,
        verdict=outcome.verdict.summary() if outcome.verdict else None,
        **m.to_dict(),
    )
    conclude(outcome)
    return m


class RoundsTimedElsewhere:
    """A clock for pytest-benchmark that reads 0 at each round's start and that round's recorded time at its end:
    rounds timed where pytest-benchmark cannot time them (a torchrun job's ranks, each round synced) become its rounds,
    median and history as they were measured. pytest-benchmark has no public way to take outside timings; pedantic
    mode reads the fixture's timer (what ``--benchmark-timer`` names) once before and once after each round."""

    def __init__(self, seconds: list[float], timed_by: str) -> None:
        self._reads = iter([read for s in seconds for read in (0.0, s)])
        self.__name__ = f"rounds timed by {timed_by}"  # what pytest-benchmark's JSON names as the timer

    def __call__(self) -> float:
        return next(self._reads)


def replay_rounds(benchmark, seconds: list[float], timed_by: str) -> None:
    """Give ``benchmark`` the rounds ``seconds``, which ``timed_by`` timed (nothing when there are none: a case that
    failed before its rounds has no time)."""
    if seconds:
        benchmark._timer = RoundsTimedElsewhere(seconds, timed_by)
        benchmark.pedantic(lambda: None, rounds=len(seconds), iterations=1, warmup_rounds=0)


def converge_case(
    benchmark,
    gate,
    request: pytest.FixtureRequest,
    study: Study,
    model: str,
    recipe_name: str,
    schedule: Schedule | None = None,
) -> Convergence | None:
    """Train one case of ``study`` for its whole schedule (or ``schedule``) and gate what it learned
    (gptcore.measure.convergence); skip what the device cannot run. pytest-benchmark gets one round: the run's training
    seconds, synced, evaluations excluded (the figure its time-to-loss reports), not the building of the Trainer or the
    evaluations. On CPU each case runs on one thread: bit-identical whatever else runs beside it, so that its
    time-to-loss can be gated exactly."""
    recipe, device, cfg = RECIPES[recipe_name], study.device, MODELS[model]
    schedule = schedule or study.schedule
    reason = unsupported_reason(recipe, device, cfg)
    if reason:
        pytest.skip(reason)
    run, error = None, None
    try:
        run = converge(cfg, recipe, schedule, device, threads=1 if device == "cpu" else None)
        replay_rounds(benchmark, [run.seconds[-1]], "the training run, evaluations excluded")
    except Exception as err:  # an OOM (also one raised while compiling) is a failed case with its
        if out_of_memory_in(err) is None:  # numbers, and the rest of the suite goes on; anything else is raised
            raise
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
        error = f"out of memory (peak allocated {peak:,} B)"
        if device == "cuda":
            torch.cuda.empty_cache()
    outcome = gate.judge_convergence(request.node, run, device=device, precision=recipe.precision, error=error)
    benchmark.extra_info.update(
        model=model,
        recipe=recipe_name,
        precision=recipe.precision,
        device=device,
        batch=recipe.batch_size(cfg),
        block_size=cfg.block_size,
        tokens_per_s=run.tokens_per_s if run else None,
        convergence=run.to_json() if run else None,
        error=error,
        verdict=outcome.verdict.summary() if outcome.verdict else None,
    )
    conclude(outcome)
    return run


def conclude(outcome: Outcome) -> None:
    """Fail the case with the gate's failure lines (an error, a failed check, an unmet expectation, a missing
    baseline under --baseline-strict); warn when it only has no baseline."""
    if outcome.failures:
        pytest.fail("\n".join(outcome.failures), pytrace=False)
    if outcome.missing:
        warnings.warn(outcome.missing, BaselineMissing, stacklevel=1)
