"""Model shapes (GPTConfig), training recipes (Recipe, its data parallelism a nested Parallel), their named
presets with their notes, and the studies that group them.

All are frozen keyword-only dataclasses validated in ``__post_init__``: an invalid combination raises
``ValueError`` naming the field (a nested one by its dotted name, ``parallel.ddp.bucket_cap_mb``). Variants are
made with ``dataclasses.replace``, which re-validates.
This module is the bottom of the package: it imports nothing heavy (no torch), so that the command line can
parse its arguments and list the presets without loading torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, get_args

# Each set of names is written once, as a Literal (the fields' type hints); the tuples the checks and messages use
# are read from it.
Precision = Literal["fp32", "tf32", "fp16", "bf16", "bf16-pure"]
Attention = Literal["manual", "sdpa", "flash", "math"]
Optimizer = Literal["adamw", "sgd"]
AdamWImpl = Literal["foreach", "fused", "for-loop"]
LRSchedule = Literal["constant", "cosine"]
CompileScope = Literal["model", "blocks"]
ParallelMode = Literal["none", "ddp", "fsdp2"]
FSDPParamDtype = Literal["bf16"]
Dataset = Literal["shakespeare", "markov", "random"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
ATTENTIONS: tuple[Attention, ...] = get_args(Attention)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
ADAMW_IMPLS: tuple[AdamWImpl, ...] = get_args(AdamWImpl)
LR_SCHEDULES: tuple[LRSchedule, ...] = get_args(LRSchedule)
COMPILE_SCOPES: tuple[CompileScope, ...] = get_args(CompileScope)
PARALLELS: tuple[ParallelMode, ...] = get_args(ParallelMode)
FSDP_PARAM_DTYPES: tuple[FSDPParamDtype, ...] = get_args(FSDPParamDtype)
#: The corpora gptcore.data can load (gptcore.data.CORPORA is this tuple).
DATASETS: tuple[Dataset, ...] = get_args(Dataset)

#: Alphabet size of the shipped Shakespeare corpus (tests/test_data.py checks it against the corpus itself).
CHAR_VOCAB = 77
GPT2_VOCAB = 50257


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


def _choose(names: tuple[str, ...]) -> str:
    """``names`` as a message lists them: 'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of a nanoGPT-style model and the corpus it reads."""

    n_layer: int
    """Number of transformer blocks."""
    n_head: int
    """Attention heads per block; must divide n_embd."""
    n_embd: int
    """Width of the residual stream."""
    block_size: int
    """Context length T: tokens per sequence (and size of the position table)."""
    vocab_size: int
    """Real vocabulary size; the loss is always over exactly these classes."""
    batch_size: int
    """Sequences per optimizer step in the study this preset comes from."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches (nanoGPT's char config uses 0.2)."""
    bias: bool = False
    """Biases in Linear and LayerNorm layers: off by default, as in nanoGPT's train.py and its shakespeare_char
    config; the GPT-2 presets turn them on (GPT-2 has them)."""
    dataset: Dataset = "shakespeare"
    """Corpus the preset trains on: 'shakespeare' (chars), 'markov' (synthetic, known entropy) or 'random'."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name, f"must be a positive integer, got {value!r}")
        _check(self.n_embd % self.n_head == 0, "n_embd",
               f"{self.n_embd} is not divisible by n_head={self.n_head}")
        _check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        _check(self.dataset in DATASETS, "dataset", f"unknown {self.dataset!r}; choose from {', '.join(DATASETS)}")
        if self.dataset == "shakespeare":
            _check(self.vocab_size == CHAR_VOCAB, "vocab_size",
                   f"the shakespeare corpus has {CHAR_VOCAB} characters, got {self.vocab_size}")


@dataclass(frozen=True, kw_only=True)
class DDPOptions:
    """DistributedDataParallel's options (its own argument names)."""

    gradient_as_bucket_view: bool = False
    """Gradients are views into the all-reduce buckets (no second copy of the gradients)."""
    bucket_cap_mb: float = 25.0
    """All-reduce bucket size in MiB (DDP's default)."""

    def __post_init__(self) -> None:
        _check(self.gradient_as_bucket_view in (True, False), "parallel.ddp.gradient_as_bucket_view",
               "must be true or false")
        _check(self.bucket_cap_mb > 0, "parallel.ddp.bucket_cap_mb", f"must be > 0, got {self.bucket_cap_mb}")


@dataclass(frozen=True, kw_only=True)
class FSDP2Options:
    """FSDP2's options: fully_shard's resharding and its MixedPrecisionPolicy."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (gather again in backward)."""
    param_dtype: FSDPParamDtype | None = None
    """MixedPrecisionPolicy: compute in this dtype (gradients reduced in fp32, fp32 sharded master weights);
    None keeps fp32. Needs the recipe's precision fp32."""

    def __post_init__(self) -> None:
        _check(self.reshard_after_forward in (True, False), "parallel.fsdp2.reshard_after_forward",
               "must be true or false")
        _check(self.param_dtype is None or self.param_dtype in FSDP_PARAM_DTYPES, "parallel.fsdp2.param_dtype",
               f"unknown {self.param_dtype!r}; choose None or {_choose(FSDP_PARAM_DTYPES)}")


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """Data parallelism under torchrun: DDP or FSDP2, each with its own options, or neither (one process, the
    default). The world size comes from the launcher, never from here; the batch stays global."""

    ddp: DDPOptions | None = None
    """DDP: replicated weights, gradients all-reduced in buckets. None: not DDP."""
    fsdp2: FSDP2Options | None = None
    """FSDP2: fully_shard per block, then the root (embeddings, ln_f, lm_head); parameters, gradients and optimizer
    state sharded 1/N. None: not FSDP2."""

    def __post_init__(self) -> None:
        _check(self.ddp is None or isinstance(self.ddp, DDPOptions), "parallel.ddp",
               f"must be DDPOptions or None, got {self.ddp!r}")
        _check(self.fsdp2 is None or isinstance(self.fsdp2, FSDP2Options), "parallel.fsdp2",
               f"must be FSDP2Options or None, got {self.fsdp2!r}")
        _check(self.ddp is None or self.fsdp2 is None, "parallel", "DDP and FSDP2 at once; choose one")

    @property
    def mode(self) -> ParallelMode:
        """Which one: none, ddp or fsdp2."""
        return "ddp" if self.ddp is not None else "fsdp2" if self.fsdp2 is not None else "none"


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How to train: every optimization the studies vary is one field here."""

    precision: Precision = "fp32"
    """fp32 (TF32 off), tf32 (TF32 matmuls, CUDA only), fp16 (autocast + GradScaler), bf16 (autocast,
    fp32 master weights) or bf16-pure (weights, grads and optimizer state in bf16)."""
    batch_divisor: int = 1
    """Divide the model preset's batch by this (the char-shape study's small batch is 64 -> 16, i.e. 4)."""
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
    beta2: float = 0.99
    """AdamW betas (nanoGPT char: 0.9, 0.99)."""
    weight_decay: float = 0.1
    """Decoupled weight decay on 2-D weights only (biases, LayerNorm and embeddings' 1-D params are exempt)."""
    momentum: float = 0.9
    """SGD momentum."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this; None disables it. Impossible with optim_in_backward."""
    checkpoint: bool = False
    """Non-reentrant activation checkpointing of every transformer block."""
    compile: bool = False
    """torch.compile the model."""
    compile_scope: CompileScope = "model"
    """What compile wraps: the whole model, or each transformer block (regional compilation: the blocks share
    one compiled graph, so compile time does not grow with depth)."""
    memory_budget: float | None = None
    """torch.compile's activation memory budget in [0, 1] (0 recomputes all it can, 1 saves all); needs compile."""
    optim_in_backward: bool = False
    """Step each parameter in its post-accumulate-grad hook and free its gradient at once."""
    attention: Attention = "sdpa"
    """Attention kernel: manual (masked softmax), sdpa (PyTorch chooses), flash (FlashAttention only), math."""
    vocab_multiple: int = 1
    """Pad the embedding/lm_head vocabulary to a multiple of this (64 on the ladder); logits are sliced back."""
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

    def __post_init__(self) -> None:
        _check(self.precision in PRECISIONS, "precision",
               f"unknown {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        _check(self.attention in ATTENTIONS, "attention",
               f"unknown {self.attention!r}; choose from {', '.join(ATTENTIONS)}")
        _check(self.optimizer in OPTIMIZERS, "optimizer", f"unknown {self.optimizer!r}; choose {_choose(OPTIMIZERS)}")
        _check(self.adamw_impl in ADAMW_IMPLS, "adamw_impl",
               f"unknown {self.adamw_impl!r}; choose {_choose(ADAMW_IMPLS)}")
        _check(self.schedule in LR_SCHEDULES, "schedule",
               f"unknown {self.schedule!r}; choose {_choose(LR_SCHEDULES)}")
        for name in ("batch_divisor", "grad_accum_steps", "vocab_multiple", "decay_steps"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _check(self.num_workers >= 0, "num_workers", "must be >= 0")
        _check(self.lr > 0 and 0 <= self.min_lr <= self.lr, "min_lr", "need 0 <= min_lr <= lr and lr > 0")
        _check(self.compile_scope in COMPILE_SCOPES, "compile_scope",
               f"unknown {self.compile_scope!r}; choose {_choose(COMPILE_SCOPES)}")
        if self.compile_scope != "model":
            _check(self.compile, "compile_scope", "regional compilation needs compile=True")
        if self.memory_budget is not None:
            _check(self.compile, "memory_budget", "an activation memory budget needs compile=True")
            _check(0.0 <= self.memory_budget <= 1.0, "memory_budget", f"must be in [0, 1], got {self.memory_budget}")
        if self.optim_in_backward:
            _check(self.grad_clip is None, "grad_clip",
                   "global-norm clipping needs every gradient at once; optim_in_backward steps each parameter "
                   "as soon as its gradient is ready and frees it. Set grad_clip=None")
            _check(self.grad_accum_steps == 1, "grad_accum_steps",
                   "optim_in_backward would step on every micro-batch; gradient accumulation needs the step after")
            _check(self.precision != "fp16", "precision",
                   "fp16 needs GradScaler's global inf check before any step; optim_in_backward steps early")
        self._check_parallel()
        if self.attention == "flash":
            _check(self.precision in ("fp16", "bf16", "bf16-pure"), "attention",
                   "FlashAttention runs only on fp16/bf16 inputs; use precision fp16, bf16 or bf16-pure")

    def _check_parallel(self) -> None:
        """What data parallelism cannot be combined with (the options themselves are checked by Parallel)."""
        _check(isinstance(self.parallel, Parallel), "parallel", f"must be a Parallel, got {self.parallel!r}")
        if self.parallel.mode != "none":
            _check(not self.optim_in_backward, "optim_in_backward",
                   "steps each parameter in its post-accumulate-grad hook, before DDP's all-reduce or FSDP2's "
                   "reduce-scatter has averaged the gradient over ranks: each rank would step on its own gradient")
            _check(not self.compile, "compile",
                   "torch.compile with DDP/FSDP2 is not proven equivalent here (on CPU, compile with gloo "
                   "collectives is untested); run the parallel recipe eager")
        fsdp2 = self.parallel.fsdp2
        if fsdp2 is not None:
            _check(self.precision != "fp16", "precision", "fp16 needs a GradScaler that understands sharded "
                   "gradients; use bf16 or parallel.fsdp2.param_dtype=bf16")
            if fsdp2.param_dtype is not None:
                _check(self.precision == "fp32", "precision",
                       "parallel.fsdp2.param_dtype already sets the compute dtype; use precision fp32 with it")

    def micro_batch(self, model: GPTConfig, world_size: int = 1) -> int:
        """Sequences per forward/backward on one rank: the model's batch / batch_divisor / world_size /
        grad_accum_steps (the batch stays global: the same recipe is the same optimization at any world size)."""
        batch = self.batch_size(model)
        if world_size > 1 and batch % (world_size * self.grad_accum_steps):
            raise ValueError(f"parallel: the batch of {batch} does not split into {world_size} ranks x "
                             f"{self.grad_accum_steps} micro-batches; change the batch, batch_divisor or "
                             f"grad_accum_steps, or the number of processes")
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


# ---------------------------------------------------------------------------------------------------------------
# Presets: each name's value and its note (what `python -m gptcore list` prints) written side by side

T = TypeVar("T")


@dataclass(frozen=True)
class Preset(Generic[T]):
    """A named model or recipe and its one-line note."""

    value: T
    note: str


def _values(presets: dict[str, Preset[T]]) -> dict[str, T]:
    return {name: p.value for name, p in presets.items()}


def _notes(presets: dict[str, Preset[T]]) -> dict[str, str]:
    return {name: p.note for name, p in presets.items()}


# ---------------------------------------------------------------------------------------------------------------
# Named models

_CHAR = GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=CHAR_VOCAB, batch_size=64,
                  dropout=0.2)  # nanoGPT's config/train_shakespeare_char.py (bias off, as its train.py default)
_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=CHAR_VOCAB, batch_size=12)
_GPT2 = dict(block_size=1024, vocab_size=GPT2_VOCAB, batch_size=16, dataset="random", bias=True)
_DEEP = GPTConfig(n_layer=32, n_head=16, n_embd=2048, block_size=512, vocab_size=GPT2_VOCAB, batch_size=4,
                  dataset="random", bias=True)

MODEL_PRESETS: dict[str, Preset[GPTConfig]] = {
    "char": Preset(_CHAR, "nanoGPT shakespeare_char: 6 layers, 6 heads, 384 wide, T=256, batch 64, dropout 0.2, "
                          "no biases"),
    "char-ctx2": Preset(dataclasses.replace(_CHAR, block_size=512), "char with context 512"),
    "char-layers2": Preset(dataclasses.replace(_CHAR, n_layer=12), "char with 12 layers"),
    "char-embd2": Preset(dataclasses.replace(_CHAR, n_embd=768), "char with width 768"),
    "cpu-small": Preset(_CPU, "nanoGPT's CPU command: 4 layers, 4 heads, 128 wide, T=64, batch 12, no dropout, "
                              "no biases"),
    "cpu-heads2": Preset(dataclasses.replace(_CPU, n_head=8), "cpu-small with 8 heads"),
    "cpu-layers2": Preset(dataclasses.replace(_CPU, n_layer=8), "cpu-small with 8 layers"),
    "cpu-embd2": Preset(dataclasses.replace(_CPU, n_embd=256), "cpu-small with width 256"),
    "gpt2": Preset(GPTConfig(n_layer=12, n_head=12, n_embd=768, **_GPT2),
                   "GPT-2 124M (biases on), T=1024, batch 16, random tokens"),
    "gpt2-medium": Preset(GPTConfig(n_layer=24, n_head=16, n_embd=1024, **_GPT2),
                          "GPT-2 350M, T=1024, batch 16, random tokens"),
    "gpt2-large": Preset(GPTConfig(n_layer=36, n_head=20, n_embd=1280, **_GPT2),
                         "GPT-2 774M, T=1024, batch 16, random tokens"),
    "gpt2-xl": Preset(GPTConfig(n_layer=48, n_head=25, n_embd=1600, **_GPT2),
                      "GPT-2 1.5B, T=1024, batch 16, random tokens"),
    "deep-1.6b": Preset(_DEEP, "32 layers x 2048 wide (biases on), T=512, batch 4, random tokens: the memory-recipe "
                               "study's model"),
    "deep-1.6b-char": Preset(dataclasses.replace(_DEEP, vocab_size=CHAR_VOCAB, dataset="shakespeare"),
                             "deep-1.6b on the Shakespeare characters: the memory recipes' cost in validation loss"),
}
MODELS: dict[str, GPTConfig] = _values(MODEL_PRESETS)
MODEL_NOTES: dict[str, str] = _notes(MODEL_PRESETS)

# ---------------------------------------------------------------------------------------------------------------
# Named recipes

_NANOGPT_CHAR = Recipe()  # fp32, AdamW (foreach) lr 1e-3 beta2 0.99, warmup 100 + cosine to 1e-4 at 5000, clip 1.0
_IN_BACKWARD = dict(optim_in_backward=True, grad_clip=None)

# The ladder: each rung adds one optimization to the one before. Fused AdamW throughout (build-nanogpt uses it
# wherever available), GPT-2's lr 6e-4 -> 6e-5 and beta2 0.95; manual attention, untied, unpadded and a host
# sync every step at the bottom.
_LADDER_STEPS: list[tuple[str, dict]] = [
    ("fp32", dict(precision="fp32", attention="manual", tie_weights=False, sync_every_step=True,
                  adamw_impl="fused", lr=6e-4, min_lr=6e-5, beta2=0.95)),
    ("tf32", dict(precision="tf32")),
    ("no-sync", dict(sync_every_step=False)),
    ("amp", dict(precision="bf16")),
    ("compile", dict(compile=True)),
    ("flash", dict(attention="flash")),
    ("vocab-pad", dict(vocab_multiple=64)),
    ("tied", dict(tie_weights=True)),
    ("workers", dict(num_workers=2, pin_memory=True)),
]


def _ladder() -> dict[str, Preset[Recipe]]:
    presets, fields = {}, {}
    for rung, (what, change) in enumerate(_LADDER_STEPS):
        fields.update(change)
        presets[f"ladder-{rung}"] = Preset(Recipe(**fields), f"ladder rung {rung}: "
                                           + ("fp32, naive loop" if rung == 0 else f"+ {what}"))
    return presets


_LADDER = _ladder()

#: The CPU-shape study runs nanoGPT's CPU command: every recipe with checkpointing, lr decaying to 2,000 steps,
#: and its own small batch (half) and accumulation (2 micro-batches).
_CPU_COMMAND = dict(checkpoint=True, decay_steps=2000)

RECIPE_PRESETS: dict[str, Preset[Recipe]] = {
    "fp32": Preset(_NANOGPT_CHAR, "nanoGPT char default: fp32, AdamW (foreach) lr 1e-3, warmup 100 + cosine to "
                                  "1e-4 at 5,000, clip 1.0"),
    "tf32": Preset(Recipe(precision="tf32"), "fp32 weights, TF32 tensor-core matmuls (CUDA only)"),
    "sgd-cosine": Preset(Recipe(optimizer="sgd", lr=1e-2, min_lr=1e-3),
                         "SGD momentum 0.9, warmup + cosine lr 1e-2 -> 1e-3"),
    "fp16": Preset(Recipe(precision="fp16"), "fp16 autocast + GradScaler, fp32 master weights"),
    "bf16": Preset(Recipe(precision="bf16"), "bf16 autocast, fp32 master weights"),
    "bf16-pure": Preset(Recipe(precision="bf16-pure"), "weights, gradients and optimizer state in bf16"),
    "small-batch": Preset(Recipe(batch_divisor=4), "batch / 4 (char: 64 -> 16)"),
    "half-batch": Preset(Recipe(batch_divisor=2), "batch / 2 (cpu-small: 12 -> 6)"),
    "grad-accum": Preset(Recipe(grad_accum_steps=4), "4 micro-batches of batch / 4, same effective batch"),
    "grad-accum-2": Preset(Recipe(grad_accum_steps=2), "2 micro-batches of batch / 2, same effective batch"),
    "checkpoint": Preset(Recipe(checkpoint=True), "non-reentrant activation checkpointing of every block"),
    "compile": Preset(Recipe(compile=True), "torch.compile of the whole model"),
    "compile-blocks": Preset(Recipe(compile=True, compile_scope="blocks"),
                             "torch.compile of each block (regional: one graph shared by the blocks)"),
    "optim-in-bwd": Preset(Recipe(**_IN_BACKWARD), "optimizer step inside backward (each parameter's "
                                                   "post-accumulate-grad hook), no clipping"),
    "optim-in-bwd-checkpoint": Preset(Recipe(checkpoint=True, **_IN_BACKWARD),
                                      "optimizer in backward + checkpointing"),
    "bf16-pure-optim-in-bwd-checkpoint": Preset(Recipe(precision="bf16-pure", checkpoint=True, **_IN_BACKWARD),
                                                "bf16 weights + optimizer in backward + checkpointing (the leanest)"),
    "budget-0.05": Preset(Recipe(compile=True, memory_budget=0.05), "compile with activation memory budget 0.05"),
    "budget-0.60": Preset(Recipe(compile=True, memory_budget=0.60), "compile with activation memory budget 0.60"),
    "optim-in-bwd-budget-0.05": Preset(Recipe(compile=True, memory_budget=0.05, **_IN_BACKWARD),
                                       "optimizer in backward + compile with budget 0.05"),
    "bf16-pure-budget-0.60": Preset(Recipe(precision="bf16-pure", compile=True, memory_budget=0.60),
                                    "bf16 weights + compile with budget 0.60"),
    "ckpt-fp32": Preset(Recipe(**_CPU_COMMAND),
                        "nanoGPT's CPU command: fp32 + checkpointing, lr decay to 2,000 steps"),
    "ckpt-half-batch": Preset(Recipe(batch_divisor=2, **_CPU_COMMAND), "ckpt-fp32 with batch / 2"),
    "ckpt-grad-accum-2": Preset(Recipe(grad_accum_steps=2, **_CPU_COMMAND),
                                "ckpt-fp32 with 2 micro-batches of batch / 2"),
    "ckpt-sgd-cosine": Preset(Recipe(optimizer="sgd", lr=1e-2, min_lr=1e-3, **_CPU_COMMAND),
                              "ckpt-fp32 with SGD momentum 0.9, lr 1e-2 -> 1e-3"),
    "ckpt-bf16": Preset(Recipe(precision="bf16", **_CPU_COMMAND), "ckpt-fp32 with bf16 autocast"),
    **_LADDER,
    "ddp": Preset(Recipe(parallel=Parallel(ddp=DDPOptions())), "fp32 data parallel (torchrun): DDP, gradients "
                  "all-reduced in 25 MiB buckets; the batch split over ranks"),
    "ddp-bucket-view": Preset(Recipe(parallel=Parallel(ddp=DDPOptions(gradient_as_bucket_view=True))),
                              "ddp with gradient_as_bucket_view: the gradients are views into the buckets (no extra "
                              "copy)"),
    "fsdp2": Preset(Recipe(parallel=Parallel(fsdp2=FSDP2Options())), "fp32 FSDP2 (torchrun): fully_shard per block "
                    "then the root; parameters, grads, AdamW state 1/N"),
    "fsdp2-no-reshard": Preset(Recipe(parallel=Parallel(fsdp2=FSDP2Options(reshard_after_forward=False))),
                               "fsdp2 keeping the gathered parameters after forward (no second all-gather in "
                               "backward)"),
    "fsdp2-bf16": Preset(Recipe(parallel=Parallel(fsdp2=FSDP2Options(param_dtype="bf16"))),
                         "fsdp2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 sharded master"),
}
RECIPES: dict[str, Recipe] = _values(RECIPE_PRESETS)
RECIPE_NOTES: dict[str, str] = _notes(RECIPE_PRESETS)

#: Names of earlier releases, still accepted for one release with a deprecation line: old name -> new name.
RENAMED_RECIPES: dict[str, str] = {
    "fused-optim": "optim-in-bwd",
    "fused-checkpoint": "optim-in-bwd-checkpoint",
    "bf16-fused-checkpoint": "bf16-pure-optim-in-bwd-checkpoint",
    "fused-budget-0.05": "optim-in-bwd-budget-0.05",
    "bf16-budget-0.60": "bf16-pure-budget-0.60",
}

MEMORY_RECIPES: tuple[str, ...] = (
    "fp32", "bf16-pure", "checkpoint", "compile", "optim-in-bwd", "optim-in-bwd-checkpoint",
    "bf16-pure-optim-in-bwd-checkpoint", "budget-0.05", "budget-0.60", "optim-in-bwd-budget-0.05",
    "bf16-pure-budget-0.60",
)
LADDER: tuple[str, ...] = tuple(_LADDER)

# ---------------------------------------------------------------------------------------------------------------
# Studies: the experiments the benchmarks reproduce, each a set of models x recipes


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A study's full training run, for the convergence tier: how long, how often the validation loss is read, and
    the loss the time-to-loss is measured to. The recipe's cosine decay is set to end at ``steps``."""

    steps: int
    """Optimizer steps of the whole run (nanoGPT's CPU command: 2,000; its char config: 5,000)."""
    eval_every: int
    """Read the validation loss every this many steps (and at step 0 and at the end)."""
    eval_batches: int
    """Fixed validation batches per evaluation (the model's batch size each, the same for every recipe and seed)."""
    target_loss: float | None = None
    """Time-to-loss: the first evaluation at or below this validation loss (None: no target)."""

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "eval_batches"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        _check(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0, got {self.target_loss}")

    @property
    def eval_steps(self) -> tuple[int, ...]:
        """The steps after which the validation loss is read: 0 (before training), every eval_every, and the last."""
        return tuple(dict.fromkeys((*range(0, self.steps, self.eval_every), self.steps)))


@dataclass(frozen=True)
class Study:
    """One experiment the suite reproduces: which models it varies under which recipes, and where it runs."""

    name: str
    what: str
    models: tuple[str, ...]
    recipes: tuple[str, ...]
    device: Literal["cpu", "cuda"]
    schedule: Schedule | None = None
    """The study's full training run (the convergence tier); None where the study has no quality figure."""


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("char-shape", "nanoGPT's shakespeare_char model, one dimension doubled at a time, x precision, "
          "optimizer and batch recipes", ("char", "char-ctx2", "char-layers2", "char-embd2"),
          ("fp32", "sgd-cosine", "fp16", "bf16", "small-batch", "grad-accum"), "cuda",
          Schedule(steps=5000, eval_every=250, eval_batches=20, target_loss=1.6)),
    Study("cpu-shape", "nanoGPT's CPU model, one dimension doubled at a time, x nanoGPT's CPU command's recipes",
          ("cpu-small", "cpu-heads2", "cpu-layers2", "cpu-embd2"),
          ("ckpt-fp32", "ckpt-half-batch", "ckpt-grad-accum-2", "ckpt-sgd-cosine", "ckpt-bf16"), "cpu",
          Schedule(steps=2000, eval_every=100, eval_batches=20, target_loss=2.1)),
    Study("memory-recipe", "a 1.6B model under eleven memory-saving recipes", ("deep-1.6b",), MEMORY_RECIPES,
          "cuda"),
    Study("ladder", "GPT-2 124M up the optimization ladder, one switch per rung", ("gpt2",), LADDER, "cuda"),
    Study("cpu-recipe", "nanoGPT's CPU model under every memory recipe, regional compilation and the ladder's "
          "naive bottom rung (a host sync every step): the work ledger's CPU watch", ("cpu-small",),
          MEMORY_RECIPES + ("compile-blocks", "ladder-0"), "cpu"),
)}


#: Studies of the convergence tier only (no benchmark case of their own): the memory-recipe study's model and
#: recipes on real text, since the study's own model reads random tokens, which have nothing to learn.
QUALITY_STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("memory-recipe-quality", "the memory-recipe study's model and recipes on real text: what each recipe "
          "costs in validation loss", ("deep-1.6b-char",), MEMORY_RECIPES, "cuda",
          Schedule(steps=300, eval_every=50, eval_batches=10, target_loss=2.5)),
)}

#: The CPU-shape study's schedule shortened to what CI can afford (one case, about a minute on one thread): its own
#: whole cosine decay over 400 steps, so that it has an end of training to judge.
CPU_SHAPE_SHORT = Schedule(steps=400, eval_every=50, eval_batches=20, target_loss=2.5)


def _unknown(kind: str, name: str, choices: list[str]) -> ValueError:
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ValueError(f"{kind}: unknown {name!r}; {hint}choose from {', '.join(choices)}")


def get_model(name: str) -> GPTConfig:
    """The named model preset; ValueError suggesting the closest name and listing the valid ones otherwise."""
    if name not in MODELS:
        raise _unknown("model", name, list(MODELS))
    return MODELS[name]


def get_recipe(name: str) -> Recipe:
    """The named recipe; an old name gives its new recipe with a FutureWarning; ValueError suggesting the closest
    name and listing the valid ones otherwise."""
    if name in RENAMED_RECIPES:
        new = RENAMED_RECIPES[name]
        warnings.warn(f"recipe {name!r} is now called {new!r}; the old name will be removed in the next release",
                      FutureWarning, stacklevel=2)
        name = new
    if name not in RECIPES:
        raise _unknown("recipe", name, list(RECIPES))
    return RECIPES[name]
