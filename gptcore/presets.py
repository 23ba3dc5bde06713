"""The named models, recipes and studies: one place to find what ``ckpt-grad-accum-2`` is.

Each name's value and its note (what ``python -m gptcore list`` prints) are written side by side. The types they
are made of, and their checks, are in gptcore.config. Like it, this module imports nothing heavy (no torch).
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from dataclasses import dataclass
from typing import Generic, TypeVar

from gptcore.config import (
    CHAR_VOCAB,
    CPU_THREADS,
    DDPOptions,
    FSDP2Options,
    GPTConfig,
    Parallel,
    Recipe,
    Schedule,
    Study,
    Timing,
)

GPT2_VOCAB = 50257

# Presets: a value and its note

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

_CHAR = GPTConfig(
    n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=CHAR_VOCAB, batch_size=64, dropout=0.2
)  # nanoGPT's config/train_shakespeare_char.py (bias off, as its train.py default)
_CPU = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=CHAR_VOCAB, batch_size=12)
_GPT2 = dict(block_size=1024, vocab_size=GPT2_VOCAB, batch_size=16, dataset="random", bias=True)
_DEEP = GPTConfig(
    n_layer=32, n_head=16, n_embd=2048, block_size=512, vocab_size=GPT2_VOCAB, batch_size=4, dataset="random", bias=True
)

MODEL_PRESETS: dict[str, Preset[GPTConfig]] = {
    "char": Preset(
        _CHAR, "nanoGPT shakespeare_char: 6 layers, 6 heads, 384 wide, T=256, batch 64, dropout 0.2, no biases"
    ),
    "char-ctx2": Preset(dataclasses.replace(_CHAR, block_size=512), "char with context 512"),
    "char-layers2": Preset(dataclasses.replace(_CHAR, n_layer=12), "char with 12 layers"),
    "char-embd2": Preset(dataclasses.replace(_CHAR, n_embd=768), "char with width 768"),
    "cpu-small": Preset(
        _CPU, "nanoGPT's CPU command: 4 layers, 4 heads, 128 wide, T=64, batch 12, no dropout, no biases"
    ),
    "cpu-heads2": Preset(dataclasses.replace(_CPU, n_head=8), "cpu-small with 8 heads"),
    "cpu-layers2": Preset(dataclasses.replace(_CPU, n_layer=8), "cpu-small with 8 layers"),
    "cpu-embd2": Preset(dataclasses.replace(_CPU, n_embd=256), "cpu-small with width 256"),
    "gpt2": Preset(
        GPTConfig(n_layer=12, n_head=12, n_embd=768, **_GPT2), "GPT-2 124M (biases on), T=1024, batch 16, random tokens"
    ),
    "gpt2-medium": Preset(
        GPTConfig(n_layer=24, n_head=16, n_embd=1024, **_GPT2), "GPT-2 350M, T=1024, batch 16, random tokens"
    ),
    "gpt2-large": Preset(
        GPTConfig(n_layer=36, n_head=20, n_embd=1280, **_GPT2), "GPT-2 774M, T=1024, batch 16, random tokens"
    ),
    "gpt2-xl": Preset(
        GPTConfig(n_layer=48, n_head=25, n_embd=1600, **_GPT2), "GPT-2 1.5B, T=1024, batch 16, random tokens"
    ),
    "deep-1.6b": Preset(
        _DEEP, "32 layers x 2048 wide (biases on), T=512, batch 4, random tokens: the memory-recipe study's model"
    ),
    "deep-1.6b-char": Preset(
        dataclasses.replace(_DEEP, vocab_size=CHAR_VOCAB, dataset="shakespeare"),
        "deep-1.6b on the Shakespeare characters: the memory recipes' cost in validation loss",
    ),
}
MODELS: dict[str, GPTConfig] = _values(MODEL_PRESETS)
MODEL_NOTES: dict[str, str] = _notes(MODEL_PRESETS)

# ---------------------------------------------------------------------------------------------------------------
# Named recipes

_NANOGPT_CHAR = Recipe()  # fp32, AdamW (foreach) lr 1e-3 beta2 0.99, warmup 100 + cosine to 1e-4 at 5000, clip 1.0
_IN_BACKWARD = dict(optim_in_backward=True, grad_clip=None)

#: The share of the device's memory the ladder fills from ladder-9 on: the estimate is of the eager step (compile's is
#: lower) and the CUDA libraries' workspaces and CUDA graphs' pool sit outside it.
FILL_SHARE = 0.85

# The ladder: each rung adds one optimization to the one before. Fused AdamW throughout (build-nanogpt uses it
# wherever available), GPT-2's lr 6e-4 -> 6e-5 and beta2 0.95; manual attention, untied, unpadded and a host
# sync every step at the bottom.
_LADDER_STEPS: list[tuple[str, dict]] = [
    (
        "fp32",
        dict(
            precision="fp32",
            attention="manual",
            tie_weights=False,
            sync_every_step=True,
            adamw_impl="fused",
            lr=6e-4,
            min_lr=6e-5,
            beta2=0.95,
        ),
    ),
    ("tf32", dict(precision="tf32")),
    ("no-sync", dict(sync_every_step=False)),
    ("amp", dict(precision="bf16")),
    ("compile", dict(compile=True)),
    ("flash attention (sdpa's own dispatch)", dict(attention="sdpa")),
    ("vocab-pad", dict(vocab_multiple=64)),
    ("tied", dict(tie_weights=True)),
    ("workers", dict(num_workers=2, pin_memory=True)),
    # past nanoGPT: what engineers reach for now. The batch that fills the device comes first: nanoGPT's step at the
    # fitted batch, the seed's own last move. Autotuning comes last, of the matmuls alone (max-autotune-gemm: 1.003x
    # over liger's fused loss at its batch on an H200, its cold compile 195 s): tuning every Triton kernel too
    # (max-autotune-no-cudagraphs' coordinate descent) was still compiling the FP8 case when its 10-minute GPU call
    # ended, 346 s after it began, for a step whose time is the matmuls' and attention's. Without CUDA graphs: at the
    # fitted batch a step's kernels outlast its launches many times over, so graphs have no host time to save, and
    # their private pool would keep the compiled step's memory from the eager work beside it.
    # Two switches are measured beside the ladder, not on it, since they do not pay in tokens/s on GPT-2 124M:
    # liger's fused loss saves memory (0.64x the peak per token, a batch of 356 where 146 fits) but runs outside the
    # compiled graph, and since the compiled model returns its logits detached, nanoGPT's step at the fitted batch
    # outruns it (505,597 against 524,930 tokens/s on one H200, tests/data/gpu-h200-detached-logits); FP8 over it ran
    # 0.937x (tests/data/gpu-h200-fitted): at GPT-2's width its casts cost about what its matmuls save, and liger's
    # loss keeps the vocabulary matmul, the one wide enough to pay, in bf16.
    ("the batch that fills 85% of the device (estimate --fit)", dict(fit_memory=FILL_SHARE)),
    ("autotuned matmuls (compile's max-autotune-gemm)", dict(compile_mode="max-autotune-gemm")),
]


def _ladder() -> dict[str, Preset[Recipe]]:
    presets, fields = {}, {}
    for rung, (what, change) in enumerate(_LADDER_STEPS):
        fields.update(change)
        presets[f"ladder-{rung}"] = Preset(
            Recipe(**fields), f"ladder rung {rung}: " + ("fp32, naive loop" if rung == 0 else f"+ {what}")
        )
    return presets


_LADDER = _ladder()
#: Beside the ladder, not on it: a switch measured on the ladder's model against the rung it would follow.
_FITTED = _LADDER["ladder-9"].value
_LIGER = dataclasses.replace(_FITTED, kernels=dataclasses.replace(_FITTED.kernels, loss="liger"))
_BESIDE_LADDER = {
    # The matmuls ran at 734-745 TFLOP/s in ladder-8's and 9's traced steps on an H200 (counted FLOPs over matmul
    # kernel time), 95-97% of the measured 771 peak: autotuning them has little left to win. Inductor's generated
    # kernels (norms, GELU, casts, the loss) were 29% of ladder-9's busy time; coordinate descent tunes their launch
    # configurations, keeping a candidate only where it ran faster. Beside the top rung until measured.
    "ladder-10-coordinate-descent": Preset(
        dataclasses.replace(_LADDER["ladder-10"].value, compile_mode="max-autotune-gemm-coordinate-descent"),
        "ladder-10 + inductor's generated kernels tuned by coordinate descent (coordinate_descent_tuning): beside "
        "the ladder until measured, the top rung if it pays",
    ),
    "ladder-9-liger": Preset(
        _LIGER,
        "ladder-9 + liger-kernel's fused linear cross-entropy, refitted: beside the ladder, since it saves memory, "
        "not time",
    ),
    "ladder-9-liger-fp8": Preset(
        dataclasses.replace(_LIGER, kernels=dataclasses.replace(_LIGER.kernels, fp8=True)),
        "ladder-9-liger + FP8 matmuls in the blocks (torchao float8, Hopper or newer): beside the ladder, since at "
        "GPT-2's width it does not pay",
    ),
}

#: The CPU-shape study runs nanoGPT's CPU command: every recipe with checkpointing, lr decaying to 2,000 steps,
#: and its own small batch (half) and accumulation (2 micro-batches).
_CPU_COMMAND = dict(checkpoint=True, decay_steps=2000)

RECIPE_PRESETS: dict[str, Preset[Recipe]] = {
    "fp32": Preset(
        _NANOGPT_CHAR,
        "nanoGPT char default: fp32, AdamW (foreach) lr 1e-3, warmup 100 + cosine to 1e-4 at 5,000, clip 1.0",
    ),
    "tf32": Preset(Recipe(precision="tf32"), "fp32 weights, TF32 tensor-core matmuls (CUDA only)"),
    "sgd-cosine": Preset(
        Recipe(optimizer="sgd", lr=1e-2, min_lr=1e-3), "SGD momentum 0.9, warmup + cosine lr 1e-2 -> 1e-3"
    ),
    "fp16": Preset(Recipe(precision="fp16"), "fp16 autocast + GradScaler, fp32 master weights"),
    "bf16": Preset(Recipe(precision="bf16"), "bf16 autocast, fp32 master weights"),
    "bf16-pure": Preset(Recipe(precision="bf16-pure"), "weights, gradients and optimizer state in bf16"),
    "small-batch": Preset(Recipe(batch_divisor=4), "batch / 4 (char: 64 -> 16)"),
    "half-batch": Preset(Recipe(batch_divisor=2), "batch / 2 (cpu-small: 12 -> 6)"),
    "grad-accum": Preset(Recipe(grad_accum_steps=4), "4 micro-batches of batch / 4, same effective batch"),
    "grad-accum-2": Preset(Recipe(grad_accum_steps=2), "2 micro-batches of batch / 2, same effective batch"),
    "checkpoint": Preset(Recipe(checkpoint=True), "non-reentrant activation checkpointing of every block"),
    "compile": Preset(Recipe(compile=True), "torch.compile of the whole model"),
    "compile-blocks": Preset(
        Recipe(compile=True, compile_scope="blocks"),
        "torch.compile of each block (regional: one graph shared by the blocks)",
    ),
    "optim-in-bwd": Preset(
        Recipe(**_IN_BACKWARD),
        "optimizer step inside backward (each parameter's post-accumulate-grad hook), no clipping",
    ),
    "optim-in-bwd-checkpoint": Preset(Recipe(checkpoint=True, **_IN_BACKWARD), "optimizer in backward + checkpointing"),
    "bf16-pure-optim-in-bwd-checkpoint": Preset(
        Recipe(precision="bf16-pure", checkpoint=True, **_IN_BACKWARD),
        "bf16 weights + optimizer in backward + checkpointing (the leanest)",
    ),
    "budget-0.05": Preset(Recipe(compile=True, memory_budget=0.05), "compile with activation memory budget 0.05"),
    "budget-0.60": Preset(Recipe(compile=True, memory_budget=0.60), "compile with activation memory budget 0.60"),
    "optim-in-bwd-budget-0.05": Preset(
        Recipe(compile=True, memory_budget=0.05, **_IN_BACKWARD), "optimizer in backward + compile with budget 0.05"
    ),
    "bf16-pure-budget-0.60": Preset(
        Recipe(precision="bf16-pure", compile=True, memory_budget=0.60), "bf16 weights + compile with budget 0.60"
    ),
    "ckpt-fp32": Preset(Recipe(**_CPU_COMMAND), "nanoGPT's CPU command: fp32 + checkpointing, lr decay to 2,000 steps"),
    "ckpt-half-batch": Preset(Recipe(batch_divisor=2, **_CPU_COMMAND), "ckpt-fp32 with batch / 2"),
    "ckpt-grad-accum-2": Preset(
        Recipe(grad_accum_steps=2, **_CPU_COMMAND), "ckpt-fp32 with 2 micro-batches of batch / 2"
    ),
    "ckpt-sgd-cosine": Preset(
        Recipe(optimizer="sgd", lr=1e-2, min_lr=1e-3, **_CPU_COMMAND),
        "ckpt-fp32 with SGD momentum 0.9, lr 1e-2 -> 1e-3",
    ),
    "ckpt-bf16": Preset(Recipe(precision="bf16", **_CPU_COMMAND), "ckpt-fp32 with bf16 autocast"),
    **_LADDER,
    **_BESIDE_LADDER,
    "ddp": Preset(
        Recipe(parallel=Parallel(ddp=DDPOptions())),
        "fp32 data parallel (torchrun): DDP, gradients all-reduced in 25 MiB buckets; the batch split over ranks",
    ),
    "ddp-bucket-view": Preset(
        Recipe(parallel=Parallel(ddp=DDPOptions(gradient_as_bucket_view=True))),
        "ddp with gradient_as_bucket_view: the gradients are views into the buckets (no extra copy)",
    ),
    "fsdp2": Preset(
        Recipe(parallel=Parallel(fsdp2=FSDP2Options())),
        "fp32 FSDP2 (torchrun): fully_shard per block then the root; parameters, grads, AdamW state 1/N",
    ),
    "fsdp2-no-reshard": Preset(
        Recipe(parallel=Parallel(fsdp2=FSDP2Options(reshard_after_forward=False))),
        "fsdp2 keeping the gathered parameters after forward (no second all-gather in backward)",
    ),
    "hsdp": Preset(
        Recipe(parallel=Parallel(fsdp2=FSDP2Options(replicate=2))),
        "FSDP2 on a 2-D mesh (HSDP): 2 replicas, each sharded over world/2 ranks; gradients reduce-scattered within a "
        "replica, then all-reduced across",
    ),
    "fsdp2-bf16": Preset(
        Recipe(parallel=Parallel(fsdp2=FSDP2Options(param_dtype="bf16"))),
        "fsdp2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 sharded master",
    ),
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
    # liger's loss left the ladder (ladder-10 is the autotuned matmuls now, a rung number being a place, not a name)
    "ladder-10-fp8": "ladder-9-liger-fp8",
}

MEMORY_RECIPES: tuple[str, ...] = (
    "fp32",
    "bf16-pure",
    "checkpoint",
    "compile",
    "optim-in-bwd",
    "optim-in-bwd-checkpoint",
    "bf16-pure-optim-in-bwd-checkpoint",
    "budget-0.05",
    "budget-0.60",
    "optim-in-bwd-budget-0.05",
    "bf16-pure-budget-0.60",
)
LADDER: tuple[str, ...] = tuple(_LADDER)


STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        Study(
            "char-shape",
            "nanoGPT's shakespeare_char model, one dimension doubled at a time, x precision, "
            "optimizer and batch recipes",
            ("char", "char-ctx2", "char-layers2", "char-embd2"),
            ("fp32", "sgd-cosine", "fp16", "bf16", "small-batch", "grad-accum"),
            "cuda",
            Schedule(steps=5000, eval_every=250, eval_batches=20, target_loss=1.6),
            Timing(warmup=5, rounds=10, steps_per_round=10),
        ),
        Study(
            "cpu-shape",
            "nanoGPT's CPU model, one dimension doubled at a time, x nanoGPT's CPU command's recipes",
            ("cpu-small", "cpu-heads2", "cpu-layers2", "cpu-embd2"),
            ("ckpt-fp32", "ckpt-half-batch", "ckpt-grad-accum-2", "ckpt-sgd-cosine", "ckpt-bf16"),
            "cpu",
            Schedule(steps=2000, eval_every=100, eval_batches=20, target_loss=2.1),
            # 2 warm-up steps (tracked: the peak), 3 rounds of 2, the loss after step 8; --cpu-speed: 11 rounds
            Timing(warmup=2, rounds=3, steps_per_round=2, loss_step=8, speed_rounds=11, threads=CPU_THREADS),
        ),
        Study(
            "memory-recipe",
            "a 1.6B model under eleven memory-saving recipes",
            ("deep-1.6b",),
            MEMORY_RECIPES,
            "cuda",
            timing=Timing(warmup=3, rounds=5, steps_per_round=3),
        ),
        Study(
            "ladder",
            "GPT-2 124M up the optimization ladder, one switch per rung",
            ("gpt2",),
            LADDER + tuple(_BESIDE_LADDER),
            "cuda",
            timing=Timing(warmup=5, rounds=7, steps_per_round=5),
        ),
        Study(
            "cpu-recipe",
            "nanoGPT's CPU model under every memory recipe, regional compilation and the ladder's "
            "naive bottom rung (a host sync every step): the work ledger's CPU watch",
            ("cpu-small",),
            MEMORY_RECIPES + ("compile-blocks", "ladder-0"),
            "cpu",
            timing=Timing(warmup=2, rounds=3, steps_per_round=2, loss_step=8, speed_rounds=5, threads=CPU_THREADS),
        ),
    )
}


#: Studies of the convergence tier only (no benchmark case of their own): the memory-recipe study's model and
#: recipes on real text, since the study's own model reads random tokens, which have nothing to learn.
QUALITY_STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        Study(
            "memory-recipe-quality",
            "the memory-recipe study's model and recipes on real text: what each recipe costs in validation loss",
            ("deep-1.6b-char",),
            MEMORY_RECIPES,
            "cuda",
            Schedule(steps=300, eval_every=50, eval_batches=10, target_loss=2.5),
        ),
    )
}

#: The CPU-shape study's schedule shortened to what CI can afford (one case, about 20 s on one thread): the study's
#: 100 warm-up steps, then a whole cosine decay of its own to step 200, so that it has an end of training to judge.
CPU_SHAPE_SHORT = Schedule(steps=200, eval_every=25, eval_batches=20, target_loss=2.6)


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
        warnings.warn(
            f"recipe {name!r} is now called {new!r}; the old name will be removed in the next release",
            FutureWarning,
            stacklevel=2,
        )
        name = new
    if name not in RECIPES:
        raise _unknown("recipe", name, list(RECIPES))
    return RECIPES[name]
