"""Trainer: builds model, optimizer, schedule, GradScaler, hooks and compile from (GPTConfig, Recipe, device).

``step()`` makes no host-device sync (unless the recipe asks for the naive ``sync_every_step``): the loss stays
on the device and the caller reads it when it wants to. fp16 with a non-fused optimizer is the one exception
PyTorch imposes: GradScaler.step reads its inf flag on the host, while fused AdamW takes the flag in its kernel.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import weakref
from collections.abc import Callable, Iterator, MutableMapping

import torch
import torch._functorch.config as functorch_config
import torch.nn as nn

from gptcore.config import GPTConfig, Recipe
from gptcore.training import distributed
from gptcore.training.data import Corpus, TokenBatches, check_vocab, load_corpus, make_loader
from gptcore.training.initial import initial_model
from gptcore.training.kernels import convert_to_fp8, kernels_unsupported
from gptcore.training.model import attention_unsupported

Batch = tuple[torch.Tensor, torch.Tensor]
EVAL_SEED = 20_000
"""Seed of the evaluation batches, apart from every training seed (Recipe.seed)."""


class UnsupportedRecipe(ValueError):
    """The recipe is valid but cannot run on this device (flash on CPU, TF32 off CUDA, ...)."""


def resolve_device(name: str | None = None) -> torch.device:
    """The one place a device is chosen: ``name`` if given, else CUDA when present, else CPU."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's own message lists every device type it knows, in several lines
        raise UnsupportedRecipe(f"device: only cpu and cuda are supported, got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedRecipe("device: CUDA was asked for but torch.cuda.is_available() is False")
    if device.type not in ("cpu", "cuda"):
        raise UnsupportedRecipe(f"device: only cpu and cuda are supported, got {name!r}")
    return device


def unsupported_reason(recipe: Recipe, device: torch.device | str, cfg: GPTConfig | None = None) -> str | None:
    """Why ``recipe`` cannot run on ``device`` (for model ``cfg``, when given), or None when it can. Nothing is
    ever run as something else, and nothing is run that would train on wrong gradients."""
    device = torch.device(device)
    reason = attention_unsupported(recipe.attention, device) or kernels_unsupported(recipe.kernels, device)
    if reason:
        return reason
    if cfg is not None and cfg.dropout > 0 and recipe.memory_budget is not None and recipe.memory_budget < 1.0:
        # tests/test_compile.py measures this on the installed torch and fails once torch gets it right
        return (
            f"an activation memory budget ({recipe.memory_budget}) with dropout {cfg.dropout}: torch's "
            f"partitioner recomputes dropout in backward with a fresh mask, so the gradients would be silently "
            f"wrong (pytorch/pytorch#190758); use dropout 0, or checkpointing instead of the budget"
        )
    mode = recipe.parallel.mode
    if mode != "none" and not distributed.launched():
        fsdp2 = recipe.parallel.fsdp2
        replicas = fsdp2.replicate if fsdp2 is not None else 1  # HSDP: each replica shards over 2 ranks at the least
        what, example = (f"{mode} on a 2-D mesh ({replicas} replicas)", "hsdp") if replicas > 1 else (mode, mode)
        return (
            f"parallel {what} runs under torchrun (RANK and WORLD_SIZE are unset), e.g. "
            f"torchrun --nproc-per-node={2 * replicas} -m gptcore train --model cpu-small --recipe {example}"
        )
    if device.type == "cpu":
        if recipe.precision == "tf32":
            return "tf32 is a CUDA tensor-core mode; on CPU it would silently run as fp32"
        if recipe.compile and shutil.which("g++") is None and shutil.which("c++") is None:
            return "torch.compile on CPU needs a C++ compiler (g++), none found on PATH"
    if device.type == "cuda" and recipe.precision.startswith("bf16") and not torch.cuda.is_bf16_supported():
        return f"{torch.cuda.get_device_name(device)} does not support bf16"
    return None


def compile_cache_per_isa(env: MutableMapping[str, str] = os.environ) -> str | None:
    """Keep torch.compile's cache apart when the vector ISA is forced (``$ATEN_CPU_CAPABILITY``, as emulating a CPU
    without AVX-512 sets it). Inductor keys a cached graph on the graph and torch, not on the ISA its kernels were
    written for: on an Intel Xeon with AVX-512 (torch 2.13.0+cpu), a default run that found graphs compiled under
    ``ATEN_CPU_CAPABILITY=avx2`` aborted (``free(): invalid pointer``), or computed a NaN loss. Points
    ``$TORCHINDUCTOR_CACHE_DIR`` at inductor's default folder with the ISA appended, unless it names another folder
    already (Dynamo's import sets it to the default); returns the folder (None: nothing changed). ``env``: the
    process's environment, or a test's own (ATen reads ``$ATEN_CPU_CAPABILITY`` once, at its first kernel)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    isa = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    default = os.path.abspath(default_cache_dir())
    if not isa or os.path.abspath(env.get("TORCHINDUCTOR_CACHE_DIR", default)) != default:
        return None
    env["TORCHINDUCTOR_CACHE_DIR"] = f"{default}-{isa}"
    return env["TORCHINDUCTOR_CACHE_DIR"]


_INDUCTOR_OPTIONS: dict[str, dict[str, bool]] = {
    "max-autotune-gemm": {"max_autotune_gemm": True},
    "max-autotune-gemm-coordinate-descent": {"max_autotune_gemm": True, "coordinate_descent_tuning": True},
}
"""The compile modes that are no torch mode but inductor's options (torch.compile takes a mode or options, not
both)."""


def _compile_kwargs(mode: str) -> dict:
    """torch.compile's arguments for a recipe's compile_mode: inductor's options for :data:`_INDUCTOR_OPTIONS`' modes,
    torch's own mode for the others."""
    if mode in _INDUCTOR_OPTIONS:
        return {"options": dict(_INDUCTOR_OPTIONS[mode])}
    return {"mode": None if mode == "default" else mode}


def _replays_cuda_graphs(mode: str) -> bool:
    """Whether a compile mode captures CUDA graphs (inductor's ``triton.cudagraphs``: reduce-overhead, max-autotune)."""
    options = _INDUCTOR_OPTIONS.get(mode)
    if options is None:
        import torch._inductor

        options = torch._inductor.list_mode_options(None if mode == "default" else mode)
    return bool(options.get("triton.cudagraphs"))


def check_runnable(recipe: Recipe, device: torch.device | str, cfg: GPTConfig | None = None) -> None:
    """Raise UnsupportedRecipe with the reason when ``recipe`` cannot run on ``device`` (for model ``cfg``)."""
    reason = unsupported_reason(recipe, device, cfg)
    if reason:
        raise UnsupportedRecipe(reason)


def lr_at(step: int, recipe: Recipe) -> float:
    """Learning rate at optimizer step ``step`` (0-based), as nanoGPT's train.py computes it: constant, or a linear
    warmup lr * (step + 1) / (warmup + 1), then cosine decay from lr to min_lr until decay_steps, then min_lr."""
    if recipe.schedule == "constant":
        return recipe.lr
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / (recipe.warmup_steps + 1)
    if step > recipe.decay_steps:
        return recipe.min_lr
    ratio = (step - recipe.warmup_steps) / max(1, recipe.decay_steps - recipe.warmup_steps)
    return recipe.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (recipe.lr - recipe.min_lr)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """nanoGPT's split: weight decay on matrices and embeddings (dim >= 2), none on biases and LayerNorms."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(groups: list[dict], recipe: Recipe) -> torch.optim.Optimizer:
    """AdamW (foreach, fused or for-loop) or SGD with momentum over ``groups``."""
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=recipe.lr, momentum=recipe.momentum)
    impl = {"foreach": dict(foreach=True), "fused": dict(fused=True), "for-loop": dict(foreach=False)}
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(recipe.beta1, recipe.beta2), **impl[recipe.adamw_impl])


class Trainer:
    """One training run: ``step()`` does one optimizer step over ``grad_accum_steps`` micro-batches."""

    def __init__(
        self,
        cfg: GPTConfig,
        recipe: Recipe,
        device: torch.device | str = "cpu",
        *,
        corpus: Corpus | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """``dtype`` is the master-weight dtype (float64 for exact CPU equivalence tests); bf16-pure overrides it."""
        self.cfg, self.recipe, self.device = cfg, recipe, torch.device(device)
        check_runnable(recipe, self.device, cfg)
        self.rank = distributed.Rank()
        if recipe.parallel.mode != "none":  # joins torchrun's process group; on a GPU the device is cuda:LOCAL_RANK
            self.rank, self.device = distributed.init(self.device)
        self.micro_batch = recipe.micro_batch(cfg, self.rank.world_size)  # per rank: the batch stays global
        self.accum = recipe.grad_accum_steps
        if recipe.precision == "bf16-pure":
            dtype = torch.bfloat16
        self.model = initial_model(cfg, recipe, self.device, dtype)  # seeds every generator from recipe.seed
        if recipe.kernels.fp8:
            convert_to_fp8(self.model.transformer.h)
        # the loss is summed over micro-batches in the master dtype, never below float32
        self.loss_dtype = torch.promote_types(dtype, torch.float32)
        if recipe.compile:
            compile_cache_per_isa()
            # Dynamo caches compiled graphs on GPT.forward's code object and its guards ignore the functorch
            # config: without a reset a second Trainer would silently reuse the first one's graph, memory
            # budget and all. Compile time is spent in warm-up, outside any timing.
            torch._dynamo.reset()
        self.forward = self.model
        if recipe.parallel.mode != "none":  # DDP: a wrapper; FSDP2: the model sharded in place (before the optimizer)
            self.forward = distributed.wrap(self.model, recipe, self.device)
        how = _compile_kwargs(recipe.compile_mode)
        if recipe.compile and recipe.compile_scope == "blocks":
            for block in self.model.transformer.h:
                block.compile(**how)  # in place; Dynamo inlines nn.Module calls, so the blocks share one graph
        elif recipe.compile:
            self.forward = torch.compile(self.model, **how)
        self._graphs = recipe.compile and _replays_cuda_graphs(recipe.compile_mode)
        self.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(recipe.precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if recipe.precision == "fp16" else None
        groups = param_groups(self.model, recipe.weight_decay)
        self.optimizers: list[torch.optim.Optimizer] = []
        if recipe.optim_in_backward:
            for group in groups:
                for p in group["params"]:
                    opt = build_optimizer([{"params": [p], "weight_decay": group["weight_decay"]}], recipe)
                    self.optimizers.append(opt)
                    p.register_post_accumulate_grad_hook(self._step_in_backward_hook(opt))
        else:
            self.optimizers.append(build_optimizer(groups, recipe))
        self.step_count = 0
        self.last_loss: float | None = None  # set only by sync_every_step
        self.corpus = corpus or load_corpus(cfg.dataset, vocab_size=cfg.vocab_size, seed=recipe.seed)
        check_vocab(self.corpus, cfg.vocab_size)
        self._pin = recipe.pin_memory and self.device.type == "cuda"  # pinning means nothing without a GPU
        self._batches: Iterator[Batch] | None = None

    # -- the hot loop --------------------------------------------------------------------------------------------

    def step(self, batch: Batch | None = None) -> torch.Tensor:
        """One optimizer step. ``batch`` (x, y) of the full batch is split into micro-batches; by default the
        micro-batches come from the training data. Returns the mean loss as a device tensor (no sync)."""
        lr = lr_at(self.step_count, self.recipe)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        micro = (
            list(zip(batch[0].chunk(self.accum), batch[1].chunk(self.accum)))
            if batch is not None
            else (self._next_batch() for _ in range(self.accum))
        )
        total = torch.zeros((), device=self.device, dtype=self.loss_dtype)
        with self.numerics():
            for i, (x, y) in enumerate(micro):
                x, y = x.to(self.device, non_blocking=self._pin), y.to(self.device, non_blocking=self._pin)
                if self._graphs:  # CUDA graph trees: a new iteration, whose replay may reuse the last one's outputs
                    torch.compiler.cudagraph_mark_step_begin()
                # gradients are reduced over ranks on the last micro-batch only (DDP reads its flag in forward)
                with self.gradient_sync(last=i == self.accum - 1), self.autocast():
                    loss = self.forward(x, y)[1]  # drop the logits now: backward does not need them
                loss = loss / self.accum
                (self.scaler.scale(loss) if self.scaler else loss).backward()
                total += loss.detach().to(self.loss_dtype)
        if not self.recipe.optim_in_backward:
            self._optimizer_step()
        self.step_count += 1
        if self.recipe.sync_every_step:
            self.last_loss = total.item()  # the naive loop: a host-device sync every step
        return total

    def _optimizer_step(self) -> None:
        opt = self.optimizers[0]
        if self.scaler:
            self.scaler.unscale_(opt)
        if self.recipe.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.grad_clip)
        if self.scaler:
            self.scaler.step(opt)
            self.scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    @staticmethod
    def _step_in_backward_hook(opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
        """The hook holds its optimizer weakly (the Trainer holds it): a strong reference would close the cycle
        parameter -> hook -> optimizer -> parameter through autograd's C++ hook table, which the garbage collector
        does not always see; on an H200 each optimizer-in-backward case then left its parameters and AdamW state
        (20,585,324,544 B for deep-1.6b) allocated under every case after it."""
        ref = weakref.ref(opt)

        def hook(_: torch.Tensor) -> None:
            opt = ref()
            if opt is None:
                raise RuntimeError("optimizer in backward: its Trainer is gone; train this model with a new Trainer")
            opt.step()
            opt.zero_grad(set_to_none=True)  # the gradient is freed as soon as it is used

        return hook

    def gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Under DDP/FSDP2, reduce gradients over ranks only when ``last``; nothing otherwise."""
        if self.recipe.parallel.mode == "none":
            return contextlib.nullcontext()
        return distributed.gradient_sync(self.forward, self.recipe, last)

    def mean_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss averaged over ranks (the single-process loss of the global batch); a collective."""
        return distributed.mean_over_ranks(loss) if self.recipe.parallel.mode != "none" else loss

    def numerics(self) -> contextlib.AbstractContextManager:
        """Float32 matmul precision (TF32 or IEEE) and the compiler's activation memory budget for this step."""
        stack = contextlib.ExitStack()
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if self.recipe.precision == "tf32" else "highest")
        stack.callback(torch.set_float32_matmul_precision, previous)
        if self.recipe.memory_budget is not None:
            stack.enter_context(functorch_config.patch(activation_memory_budget=self.recipe.memory_budget))
        return stack

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # -- data and evaluation -------------------------------------------------------------------------------------

    def batches(self, split: str = "train") -> TokenBatches:
        """The single-process micro-batches (all ranks' rows); ``_next_batch`` takes this rank's shard."""
        return TokenBatches(
            self.corpus, split, self.micro_batch * self.rank.world_size, self.cfg.block_size, self.recipe.seed
        )

    def step_batch(self) -> Batch:
        """The next optimizer step's whole batch from the training data: its ``grad_accum_steps`` micro-batches
        joined, which ``step(batch)`` splits again (the same tokens as ``step()`` would draw)."""
        micro = [self._next_batch() for _ in range(self.accum)]
        return torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro])

    def _next_batch(self) -> Batch:
        if self._batches is None:
            loader = make_loader(self.batches("train"), num_workers=self.recipe.num_workers, pin_memory=self._pin)
            self._batches = iter(loader)
        batch = next(self._batches)
        return distributed.shard(batch, self.rank) if self.rank.world_size > 1 else batch

    def eval_batches(self, split: str = "val") -> TokenBatches:
        """The fixed evaluation batches: the model's batch size (not the recipe's micro-batch) drawn with a seed of
        their own, so that every recipe and every training seed is evaluated on the same tokens."""
        return TokenBatches(self.corpus, split, self.cfg.batch_size, self.cfg.block_size, EVAL_SEED)

    @torch.no_grad()
    def evaluate(self, split: str = "val", n_batches: int = 10) -> float:
        """Mean loss over the first ``n_batches`` of ``eval_batches(split)`` in eval mode (dropout off), on every
        rank alike. Syncs once."""
        self.model.eval()
        data = self.eval_batches(split)
        total = torch.zeros((), device=self.device, dtype=self.loss_dtype)
        with self.numerics():
            for i in range(n_batches):
                x, y = (t.to(self.device) for t in data[i])
                with self.autocast():
                    _, loss = self.model(x, y)
                total += loss.to(self.loss_dtype)
        self.model.train()
        return (total / n_batches).item()

    def run(self, steps: int, log_every: int = 0, on_log: Callable[[int, float], None] | None = None) -> list[float]:
        """``steps`` optimizer steps. The loss is read on the host (one sync each) at step 1, every ``log_every``
        steps and at the last step, and passed to ``on_log(step, loss)``. Returns the losses read, in order."""
        if steps < 1 or log_every < 0:
            raise ValueError(f"steps must be >= 1 and log_every >= 0, got {steps}, {log_every}")
        losses = []
        for i in range(1, steps + 1):
            loss = self.step()
            if i == 1 or (log_every and i % log_every == 0) or i == steps:
                losses.append(self.mean_loss(loss).item())
                if on_log:
                    on_log(i, losses[-1])
        return losses

    @property
    def tokens_per_step(self) -> int:
        return self.recipe.tokens_per_step(self.cfg)
