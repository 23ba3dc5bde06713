"""The configuration's types: GPTConfig (model shape), Recipe (every training switch, data parallelism nested in
Parallel), Study and its Schedule; the named values are in gptcore.presets. Frozen dataclasses checked on creation
(and by ``dataclasses.replace``): ValueError names the field, a nested one dotted. No torch, for a fast CLI."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, get_args

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
ParallelMode = Literal["none", "ddp", "fsdp2"]
FSDPParamDtype = Literal["bf16"]
Dataset = Literal["shakespeare", "markov", "random"]
PARALLELS: tuple[ParallelMode, ...] = get_args(ParallelMode)
#: The corpora gptcore.training.data can load (gptcore.training.data.CORPORA is this tuple).
DATASETS: tuple[Dataset, ...] = get_args(Dataset)

#: Alphabet size of the shipped Shakespeare corpus (tests/test_data.py checks it against the corpus itself).
CHAR_VOCAB = 77


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


_RANGES = {"beta1": 1, "beta2": 1, "weight_decay": math.inf, "momentum": math.inf, "seed": math.inf}  # [0, bound)


def _check_counts(obj: object, *names: str) -> None:
    """Each named field is an integer >= 1."""
    for name in names:
        value = getattr(obj, name)
        _check(isinstance(value, int) and value >= 1, name, f"must be an integer >= 1, got {value!r}")


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
    """Biases in Linear and LayerNorm layers: off, as in nanoGPT's train.py; the GPT-2 presets turn them on."""
    dataset: Dataset = "shakespeare"
    """Corpus the preset trains on: 'shakespeare' (chars), 'markov' (synthetic, known entropy) or 'random'."""

    def __post_init__(self) -> None:
        _check_counts(self, "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size")
        _check(self.n_embd % self.n_head == 0, "n_embd", f"{self.n_embd} is not divisible by n_head={self.n_head}")
        _check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        _check(self.dataset in DATASETS, "dataset", f"unknown {self.dataset!r}; choose from {', '.join(DATASETS)}")
        if self.dataset == "shakespeare":
            _check(
                self.vocab_size == CHAR_VOCAB,
                "vocab_size",
                f"the shakespeare corpus has {CHAR_VOCAB} characters, got {self.vocab_size}",
            )


@dataclass(frozen=True, kw_only=True)
class DDPOptions:
    """DistributedDataParallel's options (its own argument names)."""

    gradient_as_bucket_view: bool = False
    """Gradients are views into the all-reduce buckets (no second copy of the gradients)."""
    bucket_cap_mb: float = 25.0
    """All-reduce bucket size in MiB (DDP's default)."""

    def __post_init__(self) -> None:
        _check(
            self.gradient_as_bucket_view in (True, False),
            "parallel.ddp.gradient_as_bucket_view",
            "must be true or false",
        )
        _check(0 < self.bucket_cap_mb < math.inf, "parallel.ddp.bucket_cap_mb", "must be a finite number > 0")


@dataclass(frozen=True, kw_only=True)
class FSDP2Options:
    """FSDP2's options: fully_shard's resharding and its MixedPrecisionPolicy."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (gather again in backward)."""
    param_dtype: FSDPParamDtype | None = None
    """MixedPrecisionPolicy's compute dtype (fp32 reductions and master shards); None: fp32. Needs precision fp32."""
    replicate: int = 1
    """HSDP: shard within groups of world / replicate ranks and replicate across ``replicate`` such groups, FSDP2 on a
    2-D device mesh (torchtitan's data_parallel_replicate_degree x data_parallel_shard_degree). 1: plain FSDP2."""

    def __post_init__(self) -> None:
        _check(
            self.reshard_after_forward in (True, False), "parallel.fsdp2.reshard_after_forward", "must be true or false"
        )
        _check(
            isinstance(self.replicate, int) and self.replicate >= 1, "parallel.fsdp2.replicate", "must be an int >= 1"
        )
        dtypes = get_args(FSDPParamDtype)
        _check(
            self.param_dtype is None or self.param_dtype in dtypes,
            "parallel.fsdp2.param_dtype",
            f"unknown {self.param_dtype!r}; choose None or {_choose(dtypes)}",
        )


@dataclass(frozen=True, kw_only=True)
class Parallel:
    """Data parallelism under torchrun: DDP or FSDP2 with its options, or neither. The batch stays global."""

    ddp: DDPOptions | None = None
    """DDP: replicated weights, gradients all-reduced in buckets. None: not DDP."""
    fsdp2: FSDP2Options | None = None
    """FSDP2: fully_shard per block, then the root; parameters, gradients, optimizer state 1/N. None: not FSDP2."""

    def __post_init__(self) -> None:
        _check(
            self.ddp is None or isinstance(self.ddp, DDPOptions),
            "parallel.ddp",
            f"must be DDPOptions or None, got {self.ddp!r}",
        )
        _check(
            self.fsdp2 is None or isinstance(self.fsdp2, FSDP2Options),
            "parallel.fsdp2",
            f"must be FSDP2Options or None, got {self.fsdp2!r}",
        )
        _check(self.ddp is None or self.fsdp2 is None, "parallel", "DDP and FSDP2 at once; choose one")

    @property
    def mode(self) -> ParallelMode:
        """Which one: none, ddp or fsdp2."""
        return "ddp" if self.ddp is not None else "fsdp2" if self.fsdp2 is not None else "none"


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How to train: every optimization the studies vary is one field here."""

    precision: Precision = "fp32"
    """fp32 (TF32 off), tf32 (CUDA only), fp16 (autocast + GradScaler), bf16 (autocast), bf16-pure (all in bf16)."""
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
    """AdamW's beta1."""
    beta2: float = 0.99
    """AdamW's beta2 (nanoGPT char: 0.99; GPT-2: 0.95)."""
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
    """What compile wraps: the whole model, or each block (regional: one graph shared by the blocks)."""
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

    def __post_init__(self) -> None:
        for name, names in (
            ("precision", Precision),
            ("attention", Attention),
            ("optimizer", Optimizer),
            ("adamw_impl", AdamWImpl),
            ("schedule", LRSchedule),
            ("compile_scope", CompileScope),
        ):
            value = getattr(self, name)
            _check(value in get_args(names), name, f"unknown {value!r}; choose {_choose(get_args(names))}")
        _check_counts(self, "batch_divisor", "grad_accum_steps", "vocab_multiple", "decay_steps")
        _check(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        _check(self.num_workers >= 0, "num_workers", "must be >= 0")
        _check(0 < self.lr < math.inf, "lr", f"must be a finite number > 0, got {self.lr}")
        _check(0 <= self.min_lr <= self.lr, "min_lr", f"need 0 <= min_lr <= lr, got {self.min_lr} (lr {self.lr})")
        for name, high in _RANGES.items():  # what torch's AdamW and SGD (and numpy's seeding) accept
            _check(0 <= getattr(self, name) < high, name, f"must be in [0, {high}), got {getattr(self, name)}")
        # clip_grad_norm_ with a max norm <= 0 scales the gradients by it: 0 erases them, below 0 ascends the loss
        _check(self.grad_clip is None or 0 < self.grad_clip < math.inf, "grad_clip", "must be a number > 0, or None")
        _check(self.compile or self.compile_scope == "model", "compile_scope", "regional compiling needs compile=True")
        if self.memory_budget is not None:
            _check(self.compile, "memory_budget", "an activation memory budget needs compile=True")
            _check(0.0 <= self.memory_budget <= 1.0, "memory_budget", f"must be in [0, 1], got {self.memory_budget}")
        if self.optim_in_backward:
            _check(
                self.grad_clip is None,
                "grad_clip",
                "global-norm clipping needs every gradient at once; "
                "optim_in_backward steps and frees each parameter's as soon as it is ready. Set grad_clip=None",
            )
            _check(
                self.grad_accum_steps == 1,
                "grad_accum_steps",
                "optim_in_backward would step on every micro-batch; gradient accumulation needs the step after",
            )
            _check(
                self.precision != "fp16",
                "precision",
                "fp16 needs GradScaler's global inf check before any step; optim_in_backward steps early",
            )
        self._check_parallel()
        if self.attention in ("flash", "cudnn"):
            _check(
                self.precision in HALF_PRECISIONS,
                "attention",
                f"{self.attention} attention needs fp16/bf16 inputs; use precision fp16, bf16 or bf16-pure",
            )

    def _check_parallel(self) -> None:
        """What data parallelism cannot be combined with (the options themselves are checked by Parallel)."""
        _check(isinstance(self.parallel, Parallel), "parallel", f"must be a Parallel, got {self.parallel!r}")
        if self.parallel.mode != "none":
            _check(
                not self.optim_in_backward,
                "optim_in_backward",
                "steps each parameter in its post-accumulate-grad hook, before DDP's all-reduce or FSDP2's "
                "reduce-scatter has averaged the gradient over ranks: each rank would step on its own gradient",
            )
            _check(
                not self.compile,
                "compile",
                "torch.compile with DDP/FSDP2 is not proven equivalent here "
                "(untested with gloo collectives on CPU); run the parallel recipe eager",
            )
        fsdp2 = self.parallel.fsdp2
        if fsdp2 is not None:
            _check(
                self.precision != "fp16",
                "precision",
                "fp16 needs a GradScaler that understands sharded "
                "gradients; use bf16 or parallel.fsdp2.param_dtype=bf16",
            )
            if fsdp2.param_dtype is not None:
                _check(
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
        _check_counts(self, "steps", "eval_every", "eval_batches")
        _check(self.target_loss is None or self.target_loss > 0, "target_loss", f"must be > 0, got {self.target_loss}")

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
