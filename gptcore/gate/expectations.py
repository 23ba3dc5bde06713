"""What each optimization is for, as data, checked within one run on any device, with no baseline file.

A baseline says "as before"; an expectation says "as it should be". Each recipe with an effect declares it against
a reference recipe of the same model (and world size): a metric, a direction and a bound. When both cases ran in
the session, the later one is judged, so a first run on a new GPU, a new torch or a new runner already says
whether checkpointing still saves memory. An expectation holds even when the baseline was recorded with the
optimization already broken.

Bounds:

* peak memory, ``lower``: below the reference, and at most the reference's peak times the estimate's ratio of
  the two cases plus ``MEMORY_SLACK`` (the estimator predicts the saving; the slack covers what it leaves out).
  Without an estimate, only "below the reference". Where the estimate misses the reference's measured peak by
  more than that slack, its ratio predicts nothing (the estimate is of the eager step: a compiled step's loss can
  save what it counts); the case is then held below the reference and to at most its own estimate plus the slack
  of the reference's peak (a fused loss that saved nothing would still be far above its own estimate).
  Where the estimate predicts no saving (its ratio at least 1 - ``MEMORY_SLACK``: the peak is where the recipe
  saves nothing, e.g. checkpointing when the optimizer step's AdamW state and temporaries, not the activations, make
  deep-1.6b's peak), it is judged ``not higher``, and its bound says so.
* peak memory, ``not higher``: at most the reference's peak plus ``MEMORY_SLACK`` (for a recipe whose saving
  depends on where the peak is, or on the compiler).
* peak memory per token: the same bounds over the peak and the estimate divided by the tokens of a step, for two
  cases whose batches differ: a rung that fills the device turns a saving into a larger batch, not a lower peak.
* tokens/s, ``not lower``: not below the reference by more than the noise of the two medians: the sum of their
  IQRs, at least ``SPEED_FLOOR`` of the reference (the ladder's rule).
* tokens/s, ``higher``: the median above the reference's.
* loss, ``same``: within ``LOSS_SLACK`` of the reference's, read at the same step, for a switch that changes which
  kernels run and not the arithmetic (autotuned configurations), on the same batches from the same weights.

Speed expectations apply on a GPU only: CPU tokens/s is reported, not gated (a shared 2-core machine's timings
move by 1.5-2x). A peak that is not measured (a case that failed) is reported as such. Gradient accumulation's
other claim, the loss of the large batch, is proven exactly in ``tests/test_train.py`` on the same data; the
benchmarks draw each micro-batch separately, so their losses are not comparable case to case.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gptcore.gate.rules import is_number
from gptcore.gate.schema import Entry, kernel_free_peak
from gptcore.presets import LADDER, RECIPES
from gptcore.units import format_bytes, unit_for

MEMORY_SLACK = 0.02
SPEED_FLOOR = 0.02
LOSS_SLACK = 1e-3
"""How far a case's loss may be from its reference's where only the kernels differ: each kernel's rounding moves,
and the steps carry it. On an H200 the autotuned matmuls over liger's loss read liger's case's loss at step 40 within
2.9e-6 in three runs (tests/test_noise.py); the same case run again moves bf16 losses by at most 3.24e-5."""

Metric = Literal["peak memory", "peak memory per token", "tokens/s", "loss"]
Direction = Literal["lower", "not higher", "higher", "not lower", "same"]
GPU_ONLY = ("cuda",)


@dataclass(frozen=True)
class Expectation:
    """``recipe``'s ``metric`` is ``direction`` than ``reference``'s, for the same model, on ``devices``."""

    recipe: str
    reference: str
    metric: Metric
    direction: Direction
    why: str
    devices: tuple[str, ...] = ("cpu", "cuda")


def _lower_memory(recipe: str, reference: str, why: str) -> Expectation:
    return Expectation(recipe, reference, "peak memory", "lower", why)


def _same_loss(recipe: str, reference: str, why: str) -> Expectation:
    return Expectation(recipe, reference, "loss", "same", why, GPU_ONLY)


def _ladder() -> list[Expectation]:
    """Each rung of the ladder is not slower than the one before (on a GPU)."""
    return [
        Expectation(now, before, "tokens/s", "not lower", "the ladder adds one optimization per rung", GPU_ONLY)
        for before, now in zip(LADDER, LADDER[1:])
    ]


EXPECTATIONS: tuple[Expectation, ...] = (
    _lower_memory("checkpoint", "fp32", "checkpointing keeps only each block's input"),
    _lower_memory("bf16-pure", "fp32", "weights, gradients and optimizer state in 2 bytes instead of 4"),
    _lower_memory("small-batch", "fp32", "a quarter of the activations"),
    _lower_memory("half-batch", "fp32", "half the activations"),
    _lower_memory("grad-accum", "fp32", "one micro-batch's activations at a time"),
    _lower_memory("grad-accum-2", "fp32", "one micro-batch's activations at a time"),
    _lower_memory("ckpt-half-batch", "ckpt-fp32", "half the activations"),
    _lower_memory("ckpt-grad-accum-2", "ckpt-fp32", "one micro-batch's activations at a time"),
    _lower_memory("ckpt-bf16", "ckpt-fp32", "bf16 activations"),
    _lower_memory("bf16", "fp32", "bf16 activations"),
    _lower_memory("fp16", "fp32", "fp16 activations"),
    Expectation("bf16", "fp32", "tokens/s", "higher", "bf16 tensor cores", GPU_ONLY),
    Expectation("fp16", "fp32", "tokens/s", "higher", "fp16 tensor cores", GPU_ONLY),
    Expectation(
        "optim-in-bwd",
        "fp32",
        "peak memory",
        "not higher",
        "each gradient is freed as soon as its parameter steps; without checkpointing the peak is in "
        "backward, before most gradients exist, so it saves little or nothing",
    ),
    _lower_memory(
        "optim-in-bwd-checkpoint",
        "checkpoint",
        "with checkpointing the peak moves to the optimizer step, where no full set of gradients is ever live",
    ),
    _lower_memory("bf16-pure-optim-in-bwd-checkpoint", "optim-in-bwd-checkpoint", "bf16 weights and state"),
    _lower_memory("bf16-pure-budget-0.60", "budget-0.60", "bf16 weights and state"),
    Expectation(
        "budget-0.05",
        "budget-0.60",
        "peak memory",
        "not higher",
        "a lower activation memory budget never raises the peak",
    ),
    Expectation(
        "budget-0.60",
        "compile",
        "peak memory",
        "not higher",
        "a memory budget never raises the peak above the compiler's default",
    ),
    Expectation(
        "optim-in-bwd-budget-0.05",
        "budget-0.05",
        "peak memory",
        "not higher",
        "the optimizer in backward never adds memory",
    ),
    Expectation("compile", "fp32", "tokens/s", "not lower", "fused kernels", GPU_ONLY),
    _lower_memory("fsdp2", "ddp", "parameters, gradients and optimizer state sharded 1/N"),
    _lower_memory("fsdp2", "fsdp2-no-reshard", "each block's gathered parameters freed after its forward"),
    Expectation("fsdp2-no-reshard", "fsdp2", "tokens/s", "not lower", "no second all-gather in backward", GPU_ONLY),
    Expectation("ddp-bucket-view", "ddp", "peak memory", "not higher", "gradients are views of the buckets"),
    _lower_memory("fsdp2-bf16", "fsdp2", "bf16 gathered parameters and activations"),
    *_ladder(),
    _same_loss("ladder-10", "ladder-9", "autotuning chooses among kernels that compute the same thing"),
    _same_loss("ladder-10-coordinate-descent", "ladder-10", "it tunes a kernel's launch configuration, not its math"),
    Expectation(
        "ladder-10-coordinate-descent",
        "ladder-10",
        "tokens/s",
        "not lower",
        "coordinate descent keeps a kernel's tuned launch configuration only where it ran faster than inductor's own",
        GPU_ONLY,
    ),
    Expectation(  # no claim on tokens/s: outside the compiled graph it ran 0.963x ladder-9 on an H200
        "ladder-9-liger",
        "ladder-9",
        "peak memory per token",
        "lower",
        "the fused linear cross-entropy never makes the B x T x vocab logits whole: the device holds a larger batch",
        GPU_ONLY,
    ),
    Expectation(  # no claim on tokens/s: at GPT-2's width FP8 ran 0.937x liger's case on an H200
        "ladder-9-liger-fp8",
        "ladder-9-liger",
        "peak memory per token",
        "not higher",
        "FP8 never keeps more for backward than bf16 (eager it keeps the same; compiled it kept 0.716x on an H200)",
        GPU_ONLY,
    ),
)

_UNKNOWN = [e for e in EXPECTATIONS if e.recipe not in RECIPES or e.reference not in RECIPES]
if _UNKNOWN:  # a typo here would silently check nothing
    raise ValueError(f"expectations name unknown recipes: {_UNKNOWN}")


@dataclass(frozen=True)
class Figures:
    """What a case measured, for an expectation: its peak (None where not measured), tokens/s and its IQR, the
    memory estimate (an int, or None / 'err' without one), the tokens of one step, and its loss and the step it was
    read at (None in figures logged before they were kept)."""

    peak: int | None
    tokens_per_s: float | None
    tokens_per_s_iqr: float | None
    estimate: int | str | None
    tokens_per_step: int | None = None
    loss: float | None = None
    loss_step: int | None = None

    @classmethod
    def of(cls, entry: Entry, estimate: int | str | None, tokens_per_step: int | None) -> Figures:
        """A measured case's figures as the gate judges them: its peak without the matmul kernels' scratch, which
        the estimate leaves out and the CPU model moves (``Entry.kernel_free_peak``)."""
        peak, speed, iqr = entry.kernel_free_peak(), entry.tokens_per_s, entry.tokens_per_s_iqr
        return cls(peak, speed, iqr, estimate, tokens_per_step, entry.loss, entry.loss_step)

    def per_token(self) -> Figures | None:
        """The peak and the estimate per token of a step (None without the step's tokens)."""
        if not self.tokens_per_step:
            return None
        scale = self.tokens_per_step
        estimate = self.estimate // scale if isinstance(self.estimate, int) else self.estimate
        peak = None if self.peak is None else self.peak // scale
        return replace(self, peak=peak, estimate=estimate, tokens_per_step=1)


@dataclass(frozen=True)
class EffectResult:
    """One expectation judged on one model and device."""

    expectation: Expectation
    model: str
    status: Literal["ok", "FAIL", "not measured"]
    measured: str
    """The case against its reference, e.g. '19.68 MiB vs 35.49 MiB (0.554x)'."""
    expected: str
    """The bound, with the estimate's prediction where there is one, e.g. 'at most 20.39 MiB: estimate 0.554x + 2%'."""
    line: str
    """One line for a failure (or the reason it was not measured)."""

    @property
    def claim(self) -> str:
        e = self.expectation
        return f"{e.recipe} vs {e.reference}: {e.metric} {e.direction}"


def applies(e: Expectation, device_type: str) -> bool:
    return device_type in e.devices


def judge_effect(e: Expectation, model: str, now: Figures, ref: Figures) -> EffectResult:
    """``e`` for ``model``, given the case's and the reference's figures."""
    if e.metric == "peak memory per token":
        per_now, per_ref = now.per_token(), ref.per_token()
        if per_now is None or per_ref is None:
            missing = e.recipe if per_now is None else e.reference
            line = f"{e.recipe}: the tokens of a step of {missing} not measured on this device"
            return EffectResult(e, model, "not measured", "—", "—", line)
        return _judge_memory(e, model, per_now, per_ref, " a token")
    if e.metric == "peak memory":
        return _judge_memory(e, model, now, ref)
    if e.metric == "loss":
        return _judge_loss(e, model, now, ref)
    return _judge_speed(e, model, now, ref)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}x" if b else "—"


def _judge_memory(e: Expectation, model: str, now: Figures, ref: Figures, per: str = "") -> EffectResult:
    if now.peak is None or ref.peak is None:
        missing = e.recipe if now.peak is None else e.reference
        return EffectResult(
            e, model, "not measured", "—", "—", f"{e.recipe}: peak memory of {missing} not measured on this device"
        )
    unit = unit_for(now.peak, ref.peak)

    def fmt(n: float) -> str:  # per: " a token" where the figures are per token
        return format_bytes(n, unit) + per

    estimated = isinstance(now.estimate, int) and isinstance(ref.estimate, int) and ref.estimate
    # the estimate's ratio predicts the saving only where it holds for the reference: within the slack the bound
    # allows (a compiled loss saves what the estimate, of the eager step, counts: ladder-8's is 26% over)
    off = abs(ref.estimate / ref.peak - 1) if estimated and ref.peak else None
    predicted = now.estimate / ref.estimate if off is not None and off <= MEMORY_SLACK else None
    now_text, ref_text = fmt(now.peak), fmt(ref.peak)
    no_saving = predicted is not None and predicted >= 1 - MEMORY_SLACK  # the peak is where the recipe saves nothing
    if e.direction == "lower" and not no_saving:
        if predicted is not None:
            bound = ref.peak * min(predicted + MEMORY_SLACK, 1.0)
            expected = f"at most {fmt(bound)}: estimate {predicted:.3f}x + {MEMORY_SLACK:.0%}"
        elif off is not None:  # the reference's estimate misses: the case is held to its own, with the same slack
            bound = min(now.estimate + MEMORY_SLACK * ref.peak, ref.peak)
            expected = (
                f"at most {fmt(bound)}: its estimate + {MEMORY_SLACK:.0%} of {e.reference}'s peak"
                f" (the estimate is {off:.0%} off {e.reference}'s)"
            )
        else:
            bound, expected = None, f"below {ref_text}"
        failed = now.peak >= ref.peak or (bound is not None and now.peak > bound)
        verb = "is not below" if now.peak >= ref.peak else "saves less than the estimate against"
    else:  # not higher; or lower where the estimate puts the peak where the recipe saves nothing
        bound = ref.peak * (1 + MEMORY_SLACK)
        expected = f"at most {fmt(bound)}: +{MEMORY_SLACK:.0%}" + (
            f", estimate {predicted:.3f}x" if predicted is not None else ""
        )
        if e.direction == "lower":
            expected += " (no saving at this peak)"
        failed = now.peak > bound
        verb = "is above"
    measured = f"{now_text} vs {ref_text} ({_ratio(now.peak, ref.peak)})"
    line = f"{e.recipe}: peak {now_text} {verb} {e.reference}'s {ref_text} (expected {expected})"
    return EffectResult(e, model, "FAIL" if failed else "ok", measured, expected, line if failed else "")


def _judge_speed(e: Expectation, model: str, now: Figures, ref: Figures) -> EffectResult:
    if now.tokens_per_s is None or ref.tokens_per_s is None:
        return EffectResult(e, model, "not measured", "—", "—", f"{e.recipe}: tokens/s not measured")
    ratio = _ratio(now.tokens_per_s, ref.tokens_per_s)
    measured = f"{now.tokens_per_s:,.0f} vs {ref.tokens_per_s:,.0f} tok/s ({ratio})"
    if e.direction == "higher":
        failed = now.tokens_per_s <= ref.tokens_per_s
        expected = f"above {ref.tokens_per_s:,.0f} tok/s"
        line = f"{e.recipe}: {now.tokens_per_s:,.0f} tok/s is not above {e.reference}'s {ref.tokens_per_s:,.0f}"
    else:  # not lower
        noise = max((now.tokens_per_s_iqr or 0) + (ref.tokens_per_s_iqr or 0), SPEED_FLOOR * ref.tokens_per_s)
        failed = now.tokens_per_s < ref.tokens_per_s - noise
        expected = f"at least {ref.tokens_per_s - noise:,.0f} tok/s (noise: sum of IQRs, floor {SPEED_FLOOR:.0%})"
        line = (
            f"{e.recipe}: {now.tokens_per_s:,.0f} tok/s is below {e.reference}'s {ref.tokens_per_s:,.0f} by "
            f"more than the noise bound {noise:,.0f} (sum of IQRs, floor {SPEED_FLOOR:.0%})"
        )
    return EffectResult(e, model, "FAIL" if failed else "ok", measured, expected, line if failed else "")


def _judge_loss(e: Expectation, model: str, now: Figures, ref: Figures) -> EffectResult:
    if now.loss is None or ref.loss is None or now.loss_step != ref.loss_step:
        why = "not measured" if now.loss is None or ref.loss is None else "read at different steps"
        return EffectResult(e, model, "not measured", "—", "—", f"{e.recipe}: the loss of {e.reference} {why}")
    d = now.loss - ref.loss
    measured = f"{now.loss:.6f} vs {ref.loss:.6f} at step {now.loss_step} ({d:+.1e})"
    failed = not abs(d) <= LOSS_SLACK  # a NaN fails too
    line = f"{e.recipe}: loss {now.loss:.6f} is {d:+.1e} from {e.reference}'s {ref.loss:.6f}, beyond ±{LOSS_SLACK:g}"
    expected = f"within ±{LOSS_SLACK:g} nats"
    return EffectResult(e, model, "FAIL" if failed else "ok", measured, expected, line if failed else "")


@dataclass
class Session:
    """The figures of every case that ran, keyed by (model, recipe, world size, device type), and the outcomes.
    ``record`` judges each expectation whose pair of cases is complete with this case."""

    ran: dict[tuple[str, str, int, str], Figures]
    outcomes: list[EffectResult]

    def __init__(self, expectations: tuple[Expectation, ...] = EXPECTATIONS) -> None:
        self.expectations = expectations
        self.ran = {}
        self.outcomes = []

    def record(self, model: str, recipe: str, device_type: str, figures: Figures, world: int = 1) -> list[EffectResult]:
        """Keep this case's figures; judge what it completes (as the claim or as the reference)."""
        self.ran[(model, recipe, world, device_type)] = figures
        judged = []
        for e in self.expectations:
            if not applies(e, device_type) or recipe not in (e.recipe, e.reference):
                continue
            now = self.ran.get((model, e.recipe, world, device_type))
            ref = self.ran.get((model, e.reference, world, device_type))
            if now is not None and ref is not None:
                judged.append(judge_effect(e, model, now, ref))
        self.outcomes += judged
        return judged

    def record_info(self, info: dict) -> list[EffectResult]:
        """``record`` from a benchmark's extra_info (model, recipe, device, world_size, peak_allocated_bytes,
        tokens_per_s, tokens_per_s_iqr, estimate_bytes, tokens_per_step), as the report reads a saved run; the peak
        without the matmul kernels' scratch, as the gate judges it (gptcore.gate.schema.kernel_free_peak)."""
        # a figure of another type (a run file written by another program) is none, as the report's tables show it
        n = {k: v if is_number(v) else None for k, v in info.items()}
        categories = info.get("peak_by_category")
        categories = categories if isinstance(categories, dict) and all(map(is_number, categories.values())) else None
        peak = kernel_free_peak(
            n.get("peak_allocated_bytes"), str(info.get("precision", "fp32")), info.get("cpu_model"), categories,
            n.get("kernel_scratch_bytes"),
        )  # fmt: skip
        estimate = (
            info.get("estimate_bytes") if isinstance(info.get("estimate_bytes"), str) else n.get("estimate_bytes")
        )
        figures = Figures(peak, n.get("tokens_per_s"), n.get("tokens_per_s_iqr"), estimate, n.get("tokens_per_step"))
        world = n.get("world_size") if isinstance(n.get("world_size"), int) and n["world_size"] >= 1 else 1
        return self.record(info["model"], info["recipe"], str(info.get("device", "cpu")).split(":")[0], figures, world)

    def unchecked(self) -> list[str]:
        """'cpu-small checkpoint (needs fp32)' for each case that ran with an expectation whose reference did not."""
        out = []
        for model, recipe, world, device_type in self.ran:
            for e in self.expectations:
                if (
                    e.recipe == recipe
                    and applies(e, device_type)
                    and (model, e.reference, world, device_type) not in self.ran
                ):
                    out.append(f"{model} {recipe} (needs {e.reference})")
        return out
