"""Model shapes (GPTConfig) and training recipes (Recipe), with the named presets of DESIGN.md §3 and §4.

Both are frozen keyword-only dataclasses validated in ``__post_init__``: an invalid combination raises
``ValueError`` naming the field. Variants are made with ``dataclasses.replace``, which re-validates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .data import SHAKESPEARE_VOCAB

Precision = Literal["fp32", "tf32", "fp16", "bf16", "bf16-pure"]
Attention = Literal["manual", "sdpa", "flash", "math"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "bf16-pure")
ATTENTIONS: tuple[str, ...] = ("manual", "sdpa", "flash", "math")
DATASETS: tuple[str, ...] = ("shakespeare", "markov", "random")

#: Alphabet size of the shipped Shakespeare corpus (a test checks it against the corpus itself).
CHAR_VOCAB = SHAKESPEARE_VOCAB
GPT2_VOCAB = 50257


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


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
    """Sequences per optimizer step in the seed experiment this preset comes from."""
    dropout: float = 0.0
    """Dropout on attention weights and residual branches (nanoGPT's char config uses 0.2)."""
    bias: bool = True
    """Biases in Linear and LayerNorm layers (GPT-2 has them)."""
    dataset: str = "shakespeare"
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
class Recipe:
    """How to train: every optimization of the seeds is one field here."""

    precision: Precision = "fp32"
    """fp32 (TF32 off), tf32 (TF32 matmuls, CUDA only), fp16 (autocast + GradScaler), bf16 (autocast,
    fp32 master weights) or bf16-pure (weights, grads and optimizer state in bf16)."""
    batch_divisor: int = 1
    """Divide the model preset's batch by this (seed 000's small batch is 64 -> 16, i.e. 4)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; must divide the batch. The loss of each is scaled by 1/steps."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """AdamW or SGD with momentum."""
    adamw_impl: Literal["foreach", "fused", "for-loop"] = "foreach"
    """AdamW kernel: multi-tensor foreach, single fused kernel, or one parameter at a time."""
    lr: float = 1e-3
    """Peak learning rate (nanoGPT char: 1e-3)."""
    min_lr: float = 1e-4
    """Floor of the cosine schedule."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Constant learning rate, or linear warmup then cosine decay to min_lr."""
    warmup_steps: int = 100
    """Linear warmup steps of the cosine schedule."""
    decay_steps: int = 5000
    """Step at which the cosine schedule reaches min_lr (nanoGPT char: 5000 iters)."""
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
    memory_budget: float | None = None
    """torch.compile's activation memory budget in [0, 1] (0 recomputes all it can, 1 saves all); needs compile."""
    optim_in_backward: bool = False
    """Step each parameter in its post-accumulate-grad hook and free its gradient at once."""
    attention: Attention = "sdpa"
    """Attention kernel: manual (masked softmax), sdpa (PyTorch chooses), flash (FlashAttention only), math."""
    vocab_multiple: int = 1
    """Pad the embedding/lm_head vocabulary to a multiple of this (64 in seed 004); logits are sliced back."""
    tie_weights: bool = True
    """Share the token embedding with the lm_head."""
    num_workers: int = 0
    """DataLoader worker processes (0: batches are made in the training process)."""
    pin_memory: bool = False
    """Pin host batches and copy them to the GPU with non_blocking=True."""
    sync_every_step: bool = False
    """Read the loss on the host after every step (the naive loop seed 004 starts from). Off: no sync in the loop."""
    seed: int = 1337
    """Seed for weights, dropout and batches."""

    def __post_init__(self) -> None:
        _check(self.precision in PRECISIONS, "precision",
               f"unknown {self.precision!r}; choose from {', '.join(PRECISIONS)}")
        _check(self.attention in ATTENTIONS, "attention",
               f"unknown {self.attention!r}; choose from {', '.join(ATTENTIONS)}")
        _check(self.optimizer in ("adamw", "sgd"), "optimizer", f"unknown {self.optimizer!r}; choose adamw or sgd")
        _check(self.adamw_impl in ("foreach", "fused", "for-loop"), "adamw_impl",
               f"unknown {self.adamw_impl!r}; choose foreach, fused or for-loop")
        _check(self.schedule in ("constant", "cosine"), "schedule", f"unknown {self.schedule!r}")
        for name in ("batch_divisor", "grad_accum_steps", "vocab_multiple", "decay_steps"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _check(self.num_workers >= 0, "num_workers", "must be >= 0")
        _check(self.lr > 0 and 0 <= self.min_lr <= self.lr, "min_lr", "need 0 <= min_lr <= lr and lr > 0")
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
        if self.attention == "flash":
            _check(self.precision in ("fp16", "bf16", "bf16-pure"), "attention",
                   "FlashAttention runs only on fp16/bf16 inputs; use precision fp16, bf16 or bf16-pure")

    def micro_batch(self, model: GPTConfig) -> int:
        """Sequences per forward/backward: the model's batch / batch_divisor / grad_accum_steps."""
        batch = self.batch_size(model)
        if batch % self.grad_accum_steps:
            raise ValueError(f"grad_accum_steps: {self.grad_accum_steps} does not divide the batch of {batch}")
        return batch // self.grad_accum_steps

    def batch_size(self, model: GPTConfig) -> int:
        """Sequences per optimizer step."""
        if model.batch_size % self.batch_divisor:
            raise ValueError(f"batch_divisor: {self.batch_divisor} does not divide the batch of {model.batch_size}")
        return model.batch_size // self.batch_divisor


# ---------------------------------------------------------------------------------------------------------------
# Named models (DESIGN.md §3)


_CHAR = GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=CHAR_VOCAB, batch_size=64,
                  dropout=0.2)
_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=CHAR_VOCAB, batch_size=12)
_GPT2 = dict(block_size=1024, vocab_size=GPT2_VOCAB, batch_size=16, dataset="random")

MODELS: dict[str, GPTConfig] = {
    # seed 000: nanoGPT shakespeare_char, and one dimension doubled at a time
    "char": _CHAR,
    "char-ctx2": dataclasses.replace(_CHAR, block_size=512),
    "char-layers2": dataclasses.replace(_CHAR, n_layer=12),
    "char-embd2": dataclasses.replace(_CHAR, n_embd=768),
    # seed 001: nanoGPT's CPU recipe, and one dimension doubled at a time
    "cpu-small": _CPU,
    "cpu-heads2": dataclasses.replace(_CPU, n_head=8),
    "cpu-layers2": dataclasses.replace(_CPU, n_layer=8),
    "cpu-embd2": dataclasses.replace(_CPU, n_embd=256),
    # seeds 003, 004: GPT-2 family on random tokens (throughput and memory do not depend on content)
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, **_GPT2),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, **_GPT2),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280, **_GPT2),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600, **_GPT2),
    # seed 002: "Deep One", 32 layers x 2048 hidden, about 1.6B parameters
    "deep-1.6b": GPTConfig(n_layer=32, n_head=16, n_embd=2048, block_size=512, vocab_size=GPT2_VOCAB, batch_size=4,
                           dataset="random"),
}

MODEL_NOTES: dict[str, str] = {
    "char": "seed 000: nanoGPT shakespeare_char (6 layers, 6 heads, 384 wide, T=256, batch 64, dropout 0.2)",
    "char-ctx2": "seed 000: char with context 512",
    "char-layers2": "seed 000: char with 12 layers",
    "char-embd2": "seed 000: char with width 768",
    "cpu-small": "seed 001: nanoGPT's CPU recipe (4 layers, 4 heads, 128 wide, T=64, batch 12)",
    "cpu-heads2": "seed 001: cpu-small with 8 heads",
    "cpu-layers2": "seed 001: cpu-small with 8 layers",
    "cpu-embd2": "seed 001: cpu-small with width 256",
    "gpt2": "seeds 003/004: GPT-2 124M, T=1024, random tokens",
    "gpt2-medium": "seed 003: GPT-2 350M",
    "gpt2-large": "seed 003: GPT-2 774M",
    "gpt2-xl": "seed 003: GPT-2 1.5B",
    "deep-1.6b": "seed 002: 32 layers x 2048, T=512, batch 4",
}

# ---------------------------------------------------------------------------------------------------------------
# Named recipes (DESIGN.md §4)

_NANOGPT_CHAR = Recipe()  # fp32 AdamW, lr 1e-3, beta2 0.99, clip 1.0
_OPT_BWD = dict(optim_in_backward=True, grad_clip=None)

# seed 004's ladder: each rung adds one optimization to the one before. Fused AdamW throughout (build-nanogpt
# uses it wherever available), manual attention, untied, unpadded and a host sync every step at the bottom.
_LADDER_STEPS: list[tuple[str, dict]] = [
    ("fp32", dict(precision="fp32", attention="manual", tie_weights=False, sync_every_step=True,
                  adamw_impl="fused", lr=6e-4, min_lr=6e-5, beta2=0.95, schedule="cosine")),
    ("tf32", dict(precision="tf32")),
    ("no-sync", dict(sync_every_step=False)),
    ("amp", dict(precision="bf16")),
    ("compile", dict(compile=True)),
    ("flash", dict(attention="flash")),
    ("vocab-pad", dict(vocab_multiple=64)),
    ("tied", dict(tie_weights=True)),
    ("workers", dict(num_workers=2, pin_memory=True)),
]


def _ladder() -> tuple[dict[str, Recipe], dict[str, str]]:
    recipes, notes, fields = {}, {}, {}
    for rung, (what, change) in enumerate(_LADDER_STEPS):
        fields.update(change)
        recipes[f"ladder-{rung}"] = Recipe(**fields)
        notes[f"ladder-{rung}"] = f"seed 004 rung {rung}: " + ("fp32 baseline" if rung == 0 else f"+ {what}")
    return recipes, notes


_LADDER, _LADDER_NOTES = _ladder()

RECIPES: dict[str, Recipe] = {
    "fp32": _NANOGPT_CHAR,
    "tf32": Recipe(precision="tf32"),
    "sgd-cosine": Recipe(optimizer="sgd", schedule="cosine", lr=1e-2, min_lr=1e-3),
    "fp16": Recipe(precision="fp16"),
    "bf16": Recipe(precision="bf16"),
    "bf16-pure": Recipe(precision="bf16-pure"),
    "small-batch": Recipe(batch_divisor=4),
    "grad-accum": Recipe(grad_accum_steps=4),
    "checkpoint": Recipe(checkpoint=True),
    "compile": Recipe(compile=True),
    "fused-optim": Recipe(**_OPT_BWD),
    "fused-checkpoint": Recipe(checkpoint=True, **_OPT_BWD),
    "bf16-fused-checkpoint": Recipe(precision="bf16-pure", checkpoint=True, **_OPT_BWD),
    "budget-0.05": Recipe(compile=True, memory_budget=0.05),
    "budget-0.60": Recipe(compile=True, memory_budget=0.60),
    "fused-budget-0.05": Recipe(compile=True, memory_budget=0.05, **_OPT_BWD),
    "bf16-budget-0.60": Recipe(precision="bf16-pure", compile=True, memory_budget=0.60),
    **_LADDER,
}

RECIPE_NOTES: dict[str, str] = {
    "fp32": "nanoGPT char default: fp32, AdamW (foreach), constant lr 1e-3, clip 1.0",
    "tf32": "fp32 weights, TF32 tensor-core matmuls (CUDA only)",
    "sgd-cosine": "SGD momentum 0.9, warmup + cosine lr 1e-2 -> 1e-3",
    "fp16": "fp16 autocast + GradScaler, fp32 master weights",
    "bf16": "bf16 autocast, fp32 master weights",
    "bf16-pure": "weights, gradients and optimizer state in bf16",
    "small-batch": "batch / 4 (seed 000: 64 -> 16)",
    "grad-accum": "4 micro-batches of batch / 4, same effective batch",
    "checkpoint": "non-reentrant activation checkpointing of every block",
    "compile": "torch.compile",
    "fused-optim": "optimizer step in each parameter's post-accumulate-grad hook",
    "fused-checkpoint": "optimizer in backward + checkpointing",
    "bf16-fused-checkpoint": "bf16 weights + optimizer in backward + checkpointing (seed 002's leanest)",
    "budget-0.05": "compile with activation memory budget 0.05",
    "budget-0.60": "compile with activation memory budget 0.60",
    "fused-budget-0.05": "optimizer in backward + compile with budget 0.05",
    "bf16-budget-0.60": "bf16 weights + compile with budget 0.60",
    **_LADDER_NOTES,
}

#: seed 002's eleven memory recipes, in the seed's order
MEMORY_RECIPES: tuple[str, ...] = (
    "fp32", "bf16-pure", "checkpoint", "compile", "fused-optim", "fused-checkpoint", "bf16-fused-checkpoint",
    "budget-0.05", "budget-0.60", "fused-budget-0.05", "bf16-budget-0.60",
)
LADDER: tuple[str, ...] = tuple(_LADDER)


def get_model(name: str) -> GPTConfig:
    """The named model preset; ValueError listing the valid names otherwise."""
    if name not in MODELS:
        raise ValueError(f"model: unknown {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name]


def get_recipe(name: str) -> Recipe:
    """The named recipe; ValueError listing the valid names otherwise."""
    if name not in RECIPES:
        raise ValueError(f"recipe: unknown {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name]
