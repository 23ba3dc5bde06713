"""The simulation of a memory question: two iterations of the real ``Trainer`` on fake tensors.

FakeTensorMode gives shapes, dtypes and storages without data or allocation; the tracker of ``tracker`` counts
them as it counts a real run. On the CPU the simulation gives exactly the bytes of a real tracked run; for CUDA
it rounds every storage up to the caching allocator's 512-byte blocks, as ``torch.cuda.max_memory_allocated``
counts them. Deep models are simulated at 2 and 3 layers and extrapolated, segment by segment, which is exact for
a uniform stack (see ``_extrapolated``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from gptcore.config import GPTConfig, Recipe
from gptcore.memory.analytic import Question
from gptcore.memory.categories import CATEGORIES, PeakReport, ordered
from gptcore.memory.tracker import LiveBytes, track_training


@dataclass
class Simulation(PeakReport):
    """The PeakReport of a fake-tensor run, how it was obtained, and notes."""

    method: str = "direct"
    """'direct', or 'extrapolated from 2 and 3 layers'."""
    notes: tuple[str, ...] = ()
    """What the simulation had to change or cannot see (compiled kernels, CPU kernels standing in for CUDA's)."""


class _SegmentTracker(LiveBytes):
    """LiveBytes that also keeps the peak of every segment of the step, for extrapolation.

    A segment is (step, micro-batch, phase, part), part being the embeddings, a block (by index) or the head, in
    forward and backward alike (backward enters a block when the gradient of its output is complete). Within one
    block the live bytes move in parallel for every block index, so a segment's peak is affine in the block index
    and in the number of layers: what makes extrapolation exact."""

    def __init__(self, round_to: int, counts_rng_state: bool) -> None:
        super().__init__(round_to=round_to, counts_rng_state=counts_rng_state)
        self.part: object = "setup"
        self.micro = 0
        self.segment_peaks: dict[tuple, tuple[int, int]] = {}  # segment -> (live bytes, event) at its peak
        self._micro_of_step = 0

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        event = self._event
        super().track(t, category)
        if self._event != event:  # a new storage
            key = (self.step, self.micro, self.phase, self.part)
            best = self.segment_peaks.get(key)
            if best is None or self.live > best[0]:
                self.segment_peaks[key] = (self.live, self._event)

    @contextmanager
    def segments(self, model: torch.nn.Module) -> Iterator[None]:
        """Hooks that follow the parts of ``model`` (a gptcore GPT) through forward and backward."""

        def enter(part: object) -> None:
            self.part = part

        def model_pre(*_) -> None:
            if self._micro_of_step != self.step:
                self._micro_of_step, self.micro = self.step, 0
            self.micro += 1
            enter("embed")

        def block_pre(i: int):
            def hook(_, args) -> None:
                if self.phase == "forward":  # not checkpoint's recomputation
                    enter(i)
                    if i == 0 and args[0].requires_grad:
                        args[0].register_hook(lambda _: enter("embed"))

            return hook

        def block_post(i: int):
            def hook(_, __, out) -> None:
                if self.phase == "forward" and out.requires_grad:
                    out.register_hook(lambda _: enter(i))

            return hook

        with ExitStack() as stack:
            handles = [
                model.register_forward_pre_hook(model_pre),
                model.register_forward_hook(lambda *_: enter("head")),
                model.transformer.ln_f.register_forward_pre_hook(lambda *_: enter("head")),
            ]
            for i, block in enumerate(model.transformer.h):
                handles += [block.register_forward_pre_hook(block_pre(i)), block.register_forward_hook(block_post(i))]
            for handle in handles:
                stack.callback(handle.remove)
            yield


@contextmanager
def _swappable_fakes(mode) -> Iterator[None]:
    """Let ``Module.to()`` work under FakeTensorMode while the Trainer builds its model.

    Module._apply swaps a fake parameter with torch.utils.swap_tensors, which refuses tensors that carry weak
    references, and the fake-tensor converter's memo holds one to every fake it makes (pytorch/pytorch#184976,
    torch 2.13). While the model is built the memo is a plain dict (no weakrefs); the weak one is put back after."""
    converter = getattr(getattr(mode, "fake_tensor_converter", None), "meta_converter", None)
    memo = getattr(converter, "tensor_memo", None)
    if memo is None:
        yield
        return
    converter.tensor_memo = {}
    try:
        yield
    finally:
        converter.tensor_memo = memo


_CROSS_ENTROPY_DEFAULTS = dict(
    weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", label_smoothing=0.0
)


def _all_default(kwargs: dict, defaults: dict) -> bool:
    """Whether ``kwargs`` names only arguments of ``defaults``, each at its default value."""
    return all(kwargs.get(k, v) == v for k, v in defaults.items()) and kwargs.keys() <= defaults.keys()


@contextmanager
def _cuda_autocast() -> Iterator[None]:
    """CUDA's autocast policy where it differs from the CPU's in what a GPT's step saves: the CPU's fake run then
    makes the tensors CUDA's autocast makes (checked against the dispatcher's own tables in the tests).

    - ``F.cross_entropy``: on the CPU's fp32 list, so the CPU casts the logits to fp32 and saves fp32
      log-probabilities. CUDA's autocast has no entry for it: its parts run under autocast, ``log_softmax`` with
      the dtype cross-entropy passes it (the logits' own: its fp32_set_opt_dtype policy keeps a dtype that is set)
      and ``nll_loss`` on the fp32 list, which casts those log-probabilities to fp32 and saves the copy.
    - ``F.softmax`` without a dtype: fp32 on CUDA (fp32_set_opt_dtype), the input's dtype on the CPU (no entry).

    The two functions of ``torch.nn.functional`` are replaced while it is active (model.py looks them up at each
    call). Not a TorchFunctionMode: a mode is off inside its own handler, so checkpoint's recomputation, which runs
    inside ``Tensor.backward``, would make the CPU's dtypes and fail checkpoint's check of what it saved."""
    softmax, cross_entropy = F.softmax, F.cross_entropy

    def low(x) -> bool:  # a tensor in autocast's low precision, autocast on
        return (
            torch.is_autocast_enabled("cpu")
            and isinstance(x, torch.Tensor)
            and x.dtype == torch.get_autocast_dtype("cpu")
        )

    def cuda_cross_entropy(*args, **kwargs):
        if len(args) == 2 and low(args[0]) and _all_default(kwargs, _CROSS_ENTROPY_DEFAULTS):
            logits, targets = args
            return F.nll_loss(F.log_softmax(logits, 1, dtype=logits.dtype), targets)
        return cross_entropy(*args, **kwargs)

    def cuda_softmax(*args, **kwargs):
        if args and low(args[0]) and kwargs.get("dtype") is None:
            return softmax(*args, **{**kwargs, "dtype": torch.float32})
        return softmax(*args, **kwargs)

    F.softmax, F.cross_entropy = cuda_softmax, cuda_cross_entropy
    try:
        yield
    finally:
        F.softmax, F.cross_entropy = softmax, cross_entropy


def _fake_run(cfg: GPTConfig, recipe: Recipe, cuda: bool) -> _SegmentTracker:
    """Two training iterations of a Trainer built and fed on fake tensors, tracked (``track_training``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gptcore.training.data import load_corpus
    from gptcore.training.trainer import Trainer

    with torch.random.fork_rng(devices=[]), FakeTensorMode() as mode:  # the Trainer seeds the global RNG
        with _swappable_fakes(mode):
            trainer = Trainer(cfg, recipe, "cpu", corpus=load_corpus("random", vocab_size=cfg.vocab_size))
        if cuda and recipe.optimizer == "sgd":
            for opt in trainer.optimizers:  # SGD's default on CUDA tensors (the CPU's is its for-loop)
                for group in opt.param_groups:
                    group["foreach"] = True
        shape = (recipe.batch_size(cfg), cfg.block_size)
        batches = [(torch.randint(cfg.vocab_size, shape), torch.randint(cfg.vocab_size, shape)) for _ in range(2)]
        tracker = _SegmentTracker(round_to=512 if cuda else 1, counts_rng_state=not cuda)
        with tracker.segments(trainer.model), _cuda_autocast() if cuda else nullcontext():
            track_training(trainer, batches=batches, tracker=tracker)
    return tracker


def _direct(cfg: GPTConfig, recipe: Recipe, cuda: bool) -> Simulation:
    report = _fake_run(cfg, recipe, cuda).report()
    return Simulation(report.peak_bytes, report.phase, report.step, report.by_category)


def _extrapolated(cfg: GPTConfig, recipe: Recipe, cuda: bool) -> Simulation | None:
    """The simulation of ``cfg.n_layer`` layers from runs with 2 and 3: every segment's peak (and its breakdown)
    extended linearly in the number of layers, the largest one wins. Blocks are named first, middle or last; the
    3-layer run checks that its middle block's segments lie on the line through its first and last (the peak
    within a block is affine in the block's index), else None (simulate directly)."""
    n = cfg.n_layer
    tables = []
    for layers in (2, 3):
        tracker = _fake_run(dataclasses.replace(cfg, n_layer=layers), recipe, cuda)
        table = {}
        for (step, micro, phase, part), (live, event) in tracker.segment_peaks.items():
            if isinstance(part, int):
                part = "first" if part == 0 else "last" if part == layers - 1 else "middle"
            table[(step, micro, phase, part)] = (live, event, tracker)
        tables.append(table)
    two, three = tables
    middle = {k: v for k, v in three.items() if k[3] == "middle"}
    three = {k: v for k, v in three.items() if k[3] != "middle"}
    if two.keys() != three.keys():
        return None
    for key, (live, _, _) in middle.items():
        first, last = three.get(key[:3] + ("first",)), three.get(key[:3] + ("last",))
        if first is None or last is None or 2 * live != first[0] + last[0]:
            return None

    def at_n(key: tuple) -> int:
        return two[key][0] + (n - 2) * (three[key][0] - two[key][0])

    best = max(two, key=at_n)
    (_, event2, tracker2), (_, event3, tracker3) = two[best], three[best]
    by2, by3 = tracker2.live_at(event2), tracker3.live_at(event3)
    by = {c: by2.get(c, 0) + (n - 2) * (by3.get(c, 0) - by2.get(c, 0)) for c in CATEGORIES}
    return Simulation(at_n(best), best[2], best[0], ordered(by), method="extrapolated from 2 and 3 layers")


def _cpu_stands_in_for_cuda(cfg: GPTConfig, recipe: Recipe) -> tuple[str, ...]:
    """Where the CPU kernels a CUDA simulation runs save other tensors than CUDA's would (the estimate has both)."""
    notes = []
    if cfg.dropout > 0:
        notes.append(
            "dropout: masks in the input's dtype on the CPU, bool on CUDA"
            + (
                "; the CPU's sdpa falls back to its math kernel (T x T saved), CUDA's stays O(T)"
                if recipe.attention == "sdpa"
                else ""
            )
        )
    if recipe.precision == "bf16-pure":
        notes.append("LayerNorm saves mean and rstd in bf16 on the CPU, in fp32 on CUDA")
    return tuple(notes)


Method = Literal["auto", "direct", "extrapolate"]


def simulate(question: Question, method: Method = "auto") -> Simulation:
    """Two training iterations of the real Trainer on fake tensors, tracked: the peak, its phase and step, and
    the breakdown at it. On the CPU this equals a real tracked run (``track_training``) byte for byte.

    A CUDA question runs the CPU's kernels on fake tensors with CUDA's 512-byte rounding and CUDA's autocast
    policy where it differs from the CPU's (``_cuda_autocast``); a CPU-only machine cannot fake CUDA's kernel
    choices, and the differences that remain are in ``notes``. ``method``: ``direct``
    simulates every layer; ``extrapolate`` simulates 2 and 3 layers and extends each segment's peak linearly
    (exact for a uniform stack, see ``_extrapolated``); ``auto`` extrapolates beyond 4 layers and falls back to a
    direct run if the extrapolation's own check fails."""
    if method not in get_args(Method):
        raise ValueError(f"method: unknown {method!r}; choose from {', '.join(get_args(Method))}")
    if question.recipe.kernels.loss != "torch":
        raise ValueError(
            "simulate: liger's fused loss runs Triton kernels, which fake tensors cannot; the estimate stands"
        )
    cfg, recipe, notes = question.cfg, question.recipe, question.notes
    cuda = question.device == "cuda"
    recipe = dataclasses.replace(recipe, sync_every_step=False, num_workers=0, pin_memory=False)  # host side only
    if recipe.precision == "fp16":
        notes += (
            "fp16: simulated as bf16 autocast (same sizes): GradScaler reads its inf flag on the host, which "
            "fake tensors cannot answer, and adds only scalars",
        )
        recipe = dataclasses.replace(recipe, precision="bf16")
    if cuda:
        notes += _cpu_stands_in_for_cuda(cfg, recipe)
    result = None
    if method == "extrapolate" or (method == "auto" and cfg.n_layer > 4):
        result = _extrapolated(cfg, recipe, cuda)
        if result is None and method == "extrapolate":
            raise ValueError(
                "extrapolate: the 3-layer run's middle block is off the line through its first and "
                "last; simulate directly"
            )
    result = result or _direct(cfg, recipe, cuda)
    result.notes = notes
    return result
