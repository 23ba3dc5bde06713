"""The memory question and its analytic answer: ``resolve`` turns a model, a recipe and a device into a
``Question`` (what had to change to answer it is noted), ``estimate`` answers it by arithmetic alone.

``estimate`` (about a millisecond for GPT-2 XL) walks one steady-state training step (optimizer state already
allocated) through the tensors that ``gptcore.training.model`` and ``gptcore.training.trainer`` create and free, op by
op and in order (``tally_forward``, ``tally_backward``), and keeps the peak of their sum, its phase and what was live
at that moment. It does not see workspaces allocated inside one kernel (cuBLAS, flash-attention's fp32 dq accumulator)
nor inside a compiled graph: compiled recipes are answered as their eager equivalent, and say so in their notes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gptcore.config import CUDA_ATTENTION, GPTConfig, Recipe
from gptcore.memory.categories import (
    BUFFERS,
    CATEGORIES,
    GRADIENTS,
    OPTIMIZER_STATE,
    OPTIMIZER_TEMPORARIES,
    OTHER,
    PARAMETERS,
    WEIGHT_COPIES,
    PeakReport,
    ordered,
)
from gptcore.memory.tally import Gradients, Run, Tally, step_temporaries
from gptcore.memory.tally_backward import gpt_backward
from gptcore.memory.tally_forward import gpt_forward
from gptcore.units import common_unit, in_unit


@dataclass(frozen=True)
class Question:
    """A memory question, resolved: the model and recipe as the estimate and the simulation read them, the device
    (cuda or cpu), and notes on what had to be changed to answer it. Made by ``resolve``."""

    cfg: GPTConfig
    recipe: Recipe
    device: str
    notes: tuple[str, ...] = ()


def resolve(
    cfg: GPTConfig, recipe: Recipe, *, batch: int | None = None, seq: int | None = None, device: str = "cuda"
) -> Question:
    """The model and recipe a memory question is about, and notes on what had to be changed to answer it.

    ``batch`` replaces the preset's batch (sequences per optimizer step; the recipe's divisor and gradient
    accumulation still apply), ``seq`` its context length (block_size: the position table grows with it).
    Compile and its memory budget are dropped (the eager equivalent, noted). Switches that change no tensor's
    size are mapped for a CUDA question (tf32 -> fp32, flash -> sdpa); on the CPU they are refused, as the
    Trainer refuses them. ValueError on bad input."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device: choose cuda or cpu, got {device!r}")
    for name, value in (("batch", batch), ("seq", seq)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    cfg = dataclasses.replace(cfg, batch_size=batch or cfg.batch_size, block_size=seq or cfg.block_size)
    recipe.micro_batch(cfg)  # ValueError when the divisor or the accumulation does not divide the batch
    notes = []
    if recipe.compile:
        budget = f" and activation memory budget {recipe.memory_budget}" if recipe.memory_budget is not None else ""
        notes.append(
            f"compile: the eager equivalent; inductor's fusion{budget} usually lower the real peak where "
            "activations make it (measured on an H200: GPT-2's compiled bf16 steps at 0.65-0.70x of this estimate, "
            "deep-1.6b's, whose peak is its optimizer step, at 1.00x; on CPU the CPU tier measures it)"
        )
        recipe = dataclasses.replace(
            recipe, compile=False, compile_scope="model", compile_mode="default", memory_budget=None
        )
    if recipe.fit_memory is not None:
        notes.append(f"fit_memory {recipe.fit_memory}: the batch given here (gptcore.memory.fit chooses it)")
        recipe = dataclasses.replace(recipe, fit_memory=None)
    kernels = recipe.kernels.loss != "torch" or recipe.kernels.fp8
    if device == "cpu" and (recipe.precision == "tf32" or recipe.attention in CUDA_ATTENTION or kernels):
        from gptcore.training.trainer import unsupported_reason

        raise ValueError(unsupported_reason(recipe, "cpu"))
    if recipe.precision == "tf32":
        notes.append("tf32: the tensors of fp32 (TF32 changes matmul precision, not sizes)")
        recipe = dataclasses.replace(recipe, precision="fp32")
    if recipe.attention in CUDA_ATTENTION:
        notes.append(f"{recipe.attention}: memory as sdpa's fused kernels (O(T) saved: the output and its log-sum-exp)")
        recipe = dataclasses.replace(recipe, attention="sdpa")
    if recipe.kernels.fp8:
        notes.append(
            "fp8: the tensors of the recipe's precision; torchao saves no FP8 cast, and the fp32 weight rather than a "
            "bf16 copy: over by 2 bytes a block weight (docs/memory.md)"
        )
        recipe = dataclasses.replace(recipe, kernels=dataclasses.replace(recipe.kernels, fp8=False))
    if cfg.dropout > 0 and recipe.attention == "sdpa" and device == "cpu":
        notes.append("dropout > 0 on the CPU: sdpa falls back to its math kernel, which saves T x T probabilities")
    return Question(cfg, recipe, device, tuple(notes))


def param_shapes(cfg: GPTConfig, recipe: Recipe) -> list[tuple[str, int, bool]]:
    """(name, numel, weight-decayed) of every distinct parameter, in ``GPT.parameters()`` order."""
    C, rows, bias = cfg.n_embd, recipe.vocab_rows(cfg), int(cfg.bias)
    block = [
        ("ln_1.weight", C, False),
        ("ln_1.bias", C * bias, False),
        ("attn.c_attn.weight", 3 * C * C, True),
        ("attn.c_attn.bias", 3 * C * bias, False),
        ("attn.c_proj.weight", C * C, True),
        ("attn.c_proj.bias", C * bias, False),
        ("ln_2.weight", C, False),
        ("ln_2.bias", C * bias, False),
        ("mlp.c_fc.weight", 4 * C * C, True),
        ("mlp.c_fc.bias", 4 * C * bias, False),
        ("mlp.c_proj.weight", 4 * C * C, True),
        ("mlp.c_proj.bias", C * bias, False),
    ]
    shapes = [("transformer.wte.weight", rows * C, True), ("transformer.wpe.weight", cfg.block_size * C, True)]
    shapes += [(f"transformer.h.{i}.{name}", n, decayed) for i in range(cfg.n_layer) for name, n, decayed in block]
    shapes += [("transformer.ln_f.weight", C, False), ("transformer.ln_f.bias", C * bias, False)]
    if not recipe.tie_weights:
        shapes.append(("lm_head.weight", rows * C, True))
    return [shape for shape in shapes if shape[1]]


@dataclass(frozen=True)
class Estimate:
    """The analytic peak of one training step, what was live at it, and the model's states."""

    total_bytes: int
    """The peak: the sum of ``by_category``."""
    phase: str
    """forward, backward or optimizer: where the peak happens."""
    by_category: dict[str, int]
    """Live bytes per category at the peak."""
    at_forward_end: dict[str, int]
    """Live bytes per category when the (last micro-batch's) forward returns: all saved activations."""
    at_backward_end: dict[str, int]
    """Live bytes per category when the last backward returns (before the optimizer step)."""
    states: dict[str, int]
    """Full size of parameters, gradients, optimizer state (the moments or momentum) and autocast's weight copies,
    whenever in the step they live."""
    num_params: int
    device: str
    notes: tuple[str, ...] = ()

    @property
    def bytes_per_param(self) -> float:
        """(parameters + gradients + optimizer state) / parameters: 16 for AdamW with fp32 master weights."""
        return sum(self.states[k] for k in (PARAMETERS, GRADIENTS, OPTIMIZER_STATE)) / self.num_params

    def table(self, simulated: PeakReport | None = None) -> str:
        """The breakdown at the peak as a text table, with a simulated column when given. All sizes are in one
        unit, the one the largest reads best in (GiB for GPT-2 XL, MiB for cpu-small), named in the header."""
        from tabulate import tabulate

        reports = [(self.by_category, self.total_bytes)]
        if simulated:
            reports.append((simulated.by_category, simulated.peak_bytes))
        unit = common_unit(size for by, total in reports for size in (total, *by.values()))

        def size(nbytes: int) -> str:
            return f"{nbytes:,}" if unit == "B" else f"{in_unit(nbytes, unit):,.2f}"

        rows = [
            [c] + [size(by.get(c, 0)) for by, _ in reports] for c in CATEGORIES if any(by.get(c) for by, _ in reports)
        ]
        rows.append(["peak"] + [size(total) for _, total in reports])
        rows.append(
            ["phase of the peak", self.phase] + ([f"{simulated.phase}, step {simulated.step}"] if simulated else [])
        )
        headers = [unit, "analytic"] + (["simulated"] if simulated else [])
        return tabulate(
            rows, headers=headers, colalign=("left",) + ("right",) * (len(headers) - 1), disable_numparse=True
        )


def _run(question: Question) -> Run:
    """The shapes, element sizes and switches of the question's training step."""
    cfg, recipe, cuda = question.cfg, question.recipe, question.device == "cuda"
    autocast = recipe.precision in ("fp16", "bf16")
    param_bytes = 2 if recipe.precision == "bf16-pure" else 4
    if recipe.attention in ("manual", "math"):
        attention = recipe.attention
    else:  # sdpa: a fused kernel, except on the CPU with dropout, where it falls back to the math kernel
        attention = "math" if not cuda and cfg.dropout > 0 else "fused"
    return Run(
        B=recipe.micro_batch(cfg),
        T=cfg.block_size,
        C=cfg.n_embd,
        H=cfg.n_head,
        L=cfg.n_layer,
        V=cfg.vocab_size,
        vocab_rows=recipe.vocab_rows(cfg),
        accum_steps=recipe.grad_accum_steps,
        autocast=autocast,
        param_bytes=param_bytes,
        matmul_bytes=2 if autocast else param_bytes,
        cuda=cuda,
        attention=attention,
        dropout=cfg.dropout,
        bias=cfg.bias,
        recipe=recipe,
    )


def estimate(question: Question) -> Estimate:
    """The analytic peak of a steady-state training step (optimizer state allocated) of the question's model and
    recipe on its device, its phase and its breakdown."""
    cfg, recipe = question.cfg, question.recipe
    run = _run(question)
    param_bytes = run.param_bytes
    tally = Tally(512 if run.cuda else 1)
    shapes = param_shapes(cfg, recipe)
    n_state = 2 if recipe.optimizer == "adamw" else 1
    for _, n, _ in shapes:
        tally.new(n * param_bytes, PARAMETERS)
        for _ in range(n_state):
            tally.new(n * param_bytes, OPTIMIZER_STATE)
        if recipe.optimizer == "adamw":
            tally.new(4, OPTIMIZER_TEMPORARIES)  # the 0-dim step count (the tracker tags only tensors with dims)
    for _ in range(cfg.n_layer if run.attention == "manual" else 0):
        tally.new(cfg.block_size**2, BUFFERS)  # the causal mask of each attention module
    if run.vocab_rows != run.V:
        tally.new(run.vocab_rows * param_bytes, BUFFERS)  # the lm_head's padding mask (0, -inf)
    for _ in ("input", "target"):  # the step's token ids: two tensors (two allocator blocks on CUDA)
        tally.new(8 * run.B * run.accum_steps * run.T, OTHER)
    tally.new(4, OTHER)  # the running loss
    grads = Gradients(run, tally, shapes)
    at_forward_end, divided = {}, None
    for _ in range(run.accum_steps):
        tally.phase = "forward"
        logits, blocks, head = gpt_forward(run, tally)
        at_forward_end = +tally.live
        # `loss = self.forward(x, y)[1]`: the logits die with the forward's output tuple, and the last micro-batch's
        # `loss / accum` with the name's new value
        tally.free(logits, divided)
        tally.phase = "backward"
        divided = tally.temporary(run.loss_bytes)  # `loss / accum`: the step holds it until it returns
        gpt_backward(run, tally, grads, blocks, head)
    at_backward_end = +tally.live
    if not recipe.optim_in_backward:
        tally.phase = "optimizer"
        temporaries = step_temporaries(run, [(n, decayed) for _, n, decayed in shapes])
        tally.free(*[tally.new(nbytes, OPTIMIZER_TEMPORARIES) for nbytes in temporaries])
    tally.free(divided)
    n_params = sum(n for _, n, _ in shapes)
    linear = sum(n for name, n, _ in shapes if ".c_" in name or name == "lm_head.weight")
    if recipe.tie_weights:
        linear += shapes[0][1]  # lm_head's weight is wte's
    states = {
        PARAMETERS: n_params * param_bytes,
        GRADIENTS: n_params * param_bytes,
        OPTIMIZER_STATE: n_state * n_params * param_bytes,
        WEIGHT_COPIES: 2 * linear if run.autocast else 0,
    }
    return Estimate(
        total_bytes=tally.peak,
        phase=tally.peak_phase,
        by_category=ordered(tally.at_peak),
        at_forward_end=ordered(at_forward_end),
        at_backward_end=ordered(at_backward_end),
        states=states,
        num_params=n_params,
        device=question.device,
        notes=question.notes,
    )
