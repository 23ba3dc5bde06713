"""Recipe: how to train, every switch the studies vary, grouped by what it switches (Recipe.parallel: data
parallelism; Recipe.kernels: the kernels past nanoGPT's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from gptcore.config.checks import check, check_counts, choose
from gptcore.config.model import GPTConfig
from gptcore.config.parallel import Parallel

# Each set of names is written once, as a Literal: the fields' type hints, and what the checks accept.
Precision = Literal["fp32", "tf32", "fp16", "bf16", "bf16-pure"]
HALF_PRECISIONS: tuple[Precision, ...] = ("fp16", "bf16", "bf16-pure")
"""The precisions whose matmuls run in a half type. On CPU their kernels' scratch, which the CPU peak counts, depends
on the CPU's instruction set (gptcore.memory.scratch)."""
Attention = Literal["manual", "sdpa", "flash", "efficient", "cudnn", "math"]
CUDA_ATTENTION: tuple[Attention, ...] = ("flash", "efficient", "cudnn")  # sdpa pinned to a CUDA-only kernel
Optimizer = Literal["adamw", "sgd"]
AdamWImpl = Literal["foreach", "fused", "for-loop"]
LRSchedule = Literal["constant", "cosine"]
CompileScope = Literal["model", "blocks"]
CompileMode = Literal[
    "default",
    "max-autotune-gemm",
    "max-autotune-gemm-coordinate-descent",
    "max-autotune-no-cudagraphs",
    "max-autotune",
    "reduce-overhead",
]
LossKernel = Literal["torch", "liger"]

_RANGES = {"beta1": 1, "beta2": 1, "weight_decay": math.inf, "momentum": math.inf, "seed": math.inf}  # [0, bound)


@dataclass(frozen=True, kw_only=True)
class Kernels:
    """The kernels past nanoGPT's: each one switch, from packages of the ``gpu`` extra (``pip install -e '.[gpu]'``),
    GPU-only; a recipe whose package is missing is skipped with the reason (gptcore.training.kernels)."""

    loss: LossKernel = "torch"
    """The head and the loss: torch (the lm_head's logits, then cross-entropy over them) or liger (liger-kernel's
    fused linear cross-entropy: chunk by chunk, the B x T x vocab logits never exist)."""
    fp8: bool = False
    """torchao's float8 training: the blocks' Linear layers run their matmuls in FP8 with dynamic tensorwise scales
    (Hopper or newer; the lm_head stays in the recipe's precision)."""

    def __post_init__(self) -> None:
        names = get_args(LossKernel)
        check(self.loss in names, "kernels.loss", f"unknown {self.loss!r}; choose {choose(names)}")
        check(self.fp8 in (True, False), "kernels.fp8", "must be true or false")


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How to train: every optimization the studies vary is one field here."""

    precision: Precision = "fp32"
    """fp32 (TF32 off), tf32 (CUDA only), fp16 (autocast + GradScaler), bf16 (autocast), bf16-pure (all in bf16)."""
    batch_divisor: int = 1
    """Divide the model preset's batch by this (the char-shape study's small batch is 64 -> 16, i.e. 4)."""
    fit_memory: float | None = None
    """Fill the device: the batch becomes the largest whose estimated peak fits this share of the device's memory,
    chosen by the estimator (gptcore.memory.fit, ``estimate --fit``); None: the model's batch."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; must divide the batch. The loss of each is scaled by 1/steps."""
    optimizer: Optimizer = "adamw"
    """AdamW or SGD with momentum."""
    adamw_impl: AdamWImpl = "foreach"
    """AdamW kernel: multi-tensor foreach, single fused kernel, or one parameter at a time."""
    lr: float = 1e-3
    """Peak learning rate (nanoGPT char: 1e-3)."""
    min_lr: float = 1e-4
    """Floor of the cosine schedule."""
    schedule: LRSchedule = "cosine"
    """Linear warmup then cosine decay to min_lr, as nanoGPT's train.py (the default); or a constant lr."""
    warmup_steps: int = 100
    """Linear warmup steps of the cosine schedule (nanoGPT char: 100)."""
    decay_steps: int = 5000
    """Step at which the cosine schedule reaches min_lr (nanoGPT char: 5000 iters; its CPU command: 2000)."""
    beta1: float = 0.9
    """AdamW's beta1."""
    beta2: float = 0.99
    """AdamW's beta2 (nanoGPT char: 0.99; GPT-2: 0.95)."""
    weight_decay: float = 0.1
    """Weight decay on 2-D weights only (matrices and embeddings; biases and LayerNorms are exempt): decoupled in
    AdamW; in SGD, torch's coupled L2 term (``weight_decay * param`` added to the gradient, before the momentum)."""
    momentum: float = 0.9
    """SGD momentum."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; None disables it. Impossible with optim_in_backward."""
    checkpoint: bool = False
    """Non-reentrant activation checkpointing of every transformer block."""
    compile: bool = False
    """torch.compile the model."""
    compile_scope: CompileScope = "model"
    """What compile wraps: the whole model, or each block (regional: one graph shared by the blocks)."""
    compile_mode: CompileMode = "default"
    """torch.compile's mode: default; autotuned matmuls alone (max-autotune-gemm: inductor's max_autotune_gemm
    option, each matmul's Triton templates benchmarked against cuBLAS); those and each generated kernel's launch
    configuration tuned by coordinate descent (max-autotune-gemm-coordinate-descent: inductor's
    coordinate_descent_tuning option too, no pointwise autotuning); every kernel autotuned
    (max-autotune-no-cudagraphs: the matmuls, and each Triton kernel by coordinate descent), with CUDA graphs too
    (max-autotune); or CUDA graphs alone (reduce-overhead)."""
    memory_budget: float | None = None
    """torch.compile's activation memory budget in [0, 1] (0 recomputes all it can, 1 saves all); needs compile."""
    optim_in_backward: bool = False
    """Step each parameter in its post-accumulate-grad hook and free its gradient at once."""
    attention: Attention = "sdpa"
    """Attention: manual (masked softmax), sdpa (its dispatch picks), sdpa pinned: flash, efficient, cudnn, math."""
    vocab_multiple: int = 1
    """Pad the embedding/lm_head vocabulary to a multiple of this (64 on the ladder); the padding logits are -inf."""
    tie_weights: bool = True
    """Share the token embedding with the lm_head."""
    num_workers: int = 0
    """DataLoader worker processes (0: batches are made in the training process)."""
    pin_memory: bool = False
    """Pin host batches and copy them to the GPU with non_blocking=True."""
    sync_every_step: bool = False
    """Read the loss on the host after every step (the naive loop the ladder starts from). Off: no sync in the loop."""
    seed: int = 1337
    """Seed for weights, dropout and batches."""
    parallel: Parallel = Parallel()
    """Data parallelism under torchrun: DDP or FSDP2 with its options; the default is none (one process)."""
    kernels: Kernels = Kernels()
    """The kernels past nanoGPT's: the fused linear cross-entropy, FP8 matmuls; the default is neither."""

    def __post_init__(self) -> None:
        for name, names in (
            ("precision", Precision),
            ("attention", Attention),
            ("optimizer", Optimizer),
            ("adamw_impl", AdamWImpl),
            ("schedule", LRSchedule),
            ("compile_scope", CompileScope),
            ("compile_mode", CompileMode),
        ):
            value = getattr(self, name)
            check(value in get_args(names), name, f"unknown {value!r}; choose {choose(get_args(names))}")
        check_counts(self, "batch_divisor", "grad_accum_steps", "vocab_multiple", "decay_steps")
        check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        check(self.num_workers >= 0, "num_workers", "must be >= 0")
        check(0 < self.lr < math.inf, "lr", f"must be a finite number > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, "min_lr", f"need 0 <= min_lr <= lr, got {self.min_lr} (lr {self.lr})")
        for name, high in _RANGES.items():  # what torch's AdamW and SGD (and numpy's seeding) accept
            check(0 <= getattr(self, name) < high, name, f"must be in [0, {high}), got {getattr(self, name)}")
        # clip_grad_norm_ with a max norm <= 0 scales the gradients by it: 0 erases them, below 0 ascends the loss
        check(self.grad_clip is None or 0 < self.grad_clip < math.inf, "grad_clip", "must be a number > 0, or None")
        check(self.compile or self.compile_scope == "model", "compile_scope", "regional compiling needs compile=True")
        check(self.compile or self.compile_mode == "default", "compile_mode", "a compile mode needs compile=True")
        if self.fit_memory is not None:
            check(0 < self.fit_memory <= 1, "fit_memory", f"must be a share in (0, 1], got {self.fit_memory}")
            check(self.batch_divisor == 1, "batch_divisor", "fit_memory chooses the batch; leave batch_divisor at 1")
        check(isinstance(self.kernels, Kernels), "kernels", f"must be Kernels, got {self.kernels!r}")
        if self.memory_budget is not None:
            check(self.compile, "memory_budget", "an activation memory budget needs compile=True")
            check(0.0 <= self.memory_budget <= 1.0, "memory_budget", f"must be in [0, 1], got {self.memory_budget}")
        if self.optim_in_backward:
            check(
                self.grad_clip is None,
                "grad_clip",
                "global-norm clipping needs every gradient at once; "
                "optim_in_backward steps and frees each parameter's as soon as it is ready. Set grad_clip=None",
            )
            check(
                self.grad_accum_steps == 1,
                "grad_accum_steps",
                "optim_in_backward would step on every micro-batch; gradient accumulation needs the step after",
            )
            check(
                self.precision != "fp16",
                "precision",
                "fp16 needs GradScaler's global inf check before any step; optim_in_backward steps early",
            )
        self._check_parallel()
        if self.attention in ("flash", "cudnn"):
            check(
                self.precision in HALF_PRECISIONS,
                "attention",
                f"{self.attention} attention needs fp16/bf16 inputs; use precision fp16, bf16 or bf16-pure",
            )

    def _check_parallel(self) -> None:
        """What data parallelism cannot be combined with (the options themselves are checked by Parallel)."""
        check(isinstance(self.parallel, Parallel), "parallel", f"must be a Parallel, got {self.parallel!r}")
        if self.parallel.mode != "none":
            check(
                not self.optim_in_backward,
                "optim_in_backward",
                "steps each parameter in its post-accumulate-grad hook, before DDP's all-reduce or FSDP2's "
                "reduce-scatter has averaged the gradient over ranks: each rank would step on its own gradient",
            )
            check(
                not self.compile,
                "compile",
                "torch.compile with DDP/FSDP2 is not proven equivalent here "
                "(untested with gloo collectives on CPU); run the parallel recipe eager",
            )
        fsdp2 = self.parallel.fsdp2
        if fsdp2 is not None:
            check(
                self.precision != "fp16",
                "precision",
                "fp16 needs a GradScaler that understands sharded "
                "gradients; use bf16 or parallel.fsdp2.param_dtype=bf16",
            )
            if fsdp2.param_dtype is not None:
                check(
                    self.precision == "fp32",
                    "precision",
                    "parallel.fsdp2.param_dtype already sets the compute dtype; use precision fp32 with it",
                )

    def micro_batch(self, model: GPTConfig, world_size: int = 1) -> int:
        """Sequences per forward/backward on one rank: the batch / batch_divisor / world_size / grad_accum_steps."""
        batch = self.batch_size(model)
        if world_size > 1 and batch % (world_size * self.grad_accum_steps):
            raise ValueError(
                f"parallel: the batch of {batch} does not split into {world_size} ranks x "
                f"{self.grad_accum_steps} micro-batches; change the batch or the number of processes"
            )
        if batch % self.grad_accum_steps:
            raise ValueError(f"grad_accum_steps: {self.grad_accum_steps} does not divide the batch of {batch}")
        return batch // self.grad_accum_steps // world_size

    def batch_size(self, model: GPTConfig) -> int:
        """Sequences per optimizer step."""
        if model.batch_size % self.batch_divisor:
            raise ValueError(f"batch_divisor: {self.batch_divisor} does not divide the batch of {model.batch_size}")
        return model.batch_size // self.batch_divisor

    def vocab_rows(self, model: GPTConfig) -> int:
        """Rows of the embedding and lm_head: the model's vocabulary rounded up to vocab_multiple."""
        return -(-model.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def tokens_per_step(self, model: GPTConfig) -> int:
        """Tokens per optimizer step: sequences per step x context length."""
        return self.batch_size(model) * model.block_size
