"""A lean tracker of live tensor-storage bytes: the peak, when it happened, and what was live at that moment.

``LiveBytes`` is a TorchDispatchMode that sees every op's outputs, so it works on real CPU tensors and on fake
tensors alike (same numbers). Each storage is followed with a weakref: allocation and free are numbered events,
and the breakdown at the peak is computed afterwards from those lifetimes, so tracking costs O(1) per new
storage. Categories (those of ``categories``): parameters, buffers, gradients and optimizer state are tagged by
the training hooks of ``phases``; autocast's copies of parameters are weight copies; what the forward allocates
from the lm_head on is logits and loss; what backward allocates with grad enabled inside the autograd engine
(checkpoint's recomputation) is recomputed activations; everything else is named after the phase that allocated
it. On CUDA, sizes round up to the caching allocator's 512-byte blocks, as max_memory_allocated counts them.
Not seen: memory allocated inside compiled (inductor) kernels and inside single fused C++ kernels.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from .categories import (BUFFERS, GRADIENTS, LOGITS_AND_LOSS, OPTIMIZER_STATE, OTHER, PARAMETERS, PHASE_CATEGORY,
                         RECOMPUTED, WEIGHT_COPIES, PeakReport, StorageRecord, breakdown)


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live storages created by ops while active, plus those registered with ``track``."""

    def __init__(self, round_to: int = 1) -> None:
        super().__init__()
        self.round_to = round_to
        self.live = 0
        self.peak = 0
        self.peak_event = 0
        self.peak_where = ("setup", 0)
        self.phase = "setup"
        self.step = 0
        self.in_head = False
        """Set by ``phases`` from the lm_head's forward until the model's forward returns."""
        self._copying_weight = False
        self._event = 0
        self.allocated_bytes = 0
        """Bytes of every storage counted so far, freed or not (allocation traffic, beside the peak)."""
        self._storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._records: list[StorageRecord] = []
        self._refs: list[weakref.ref] = []

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count ``t``'s storage if new; with ``category``, (re)tag it for its whole lifetime. A DTensor (FSDP2's
        sharded parameters, gradients and optimizer state) counts as this rank's local shard."""
        storage = getattr(t, "_local_tensor", t).untyped_storage()
        record = self._storages.get(storage)
        if record is None:
            nbytes = storage.nbytes()
            if self.round_to > 1:
                nbytes = -(-nbytes // self.round_to) * self.round_to
            self._event += 1
            record = StorageRecord(nbytes, category or self._category_of_new(), self._event)
            self._storages[storage] = record
            self._records.append(record)
            self._refs.append(weakref.ref(storage, lambda _, r=record: self._free(r)))
            self.live += nbytes
            self.allocated_bytes += nbytes
            if self.live > self.peak:
                self.peak, self.peak_event, self.peak_where = self.live, self._event, (self.phase, self.step)
        elif category is not None:
            record.category = category

    @property
    def allocations(self) -> int:
        """Storages counted so far, freed or not."""
        return len(self._records)

    def _category_of_new(self) -> str:
        """What an untagged new storage is, from the op that made it and where the step is."""
        if self._copying_weight:
            return WEIGHT_COPIES
        if self.phase == "forward" and self.in_head:
            return LOGITS_AND_LOSS
        if self.phase == "backward" and torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1:
            return RECOMPUTED  # inside the autograd engine, only checkpoint's recomputation enables grad
        return PHASE_CATEGORY.get(self.phase, OTHER)

    def _free(self, record: StorageRecord) -> None:
        self._event += 1
        record.died = self._event
        self.live -= record.nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # autocast's low-precision copy of a weight or bias
        self._copying_weight = (func is torch.ops.aten._to_copy.default and self.phase in ("forward", "backward")
                                and isinstance(args[0], torch.nn.Parameter))
        try:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.track(t)
        finally:
            self._copying_weight = False
        return out

    def breakdown(self, event: int) -> dict[str, int]:
        """Live bytes per category just after ``event``."""
        return breakdown(self._records, event)

    def report(self) -> PeakReport:
        """Peak bytes, where they happened, and what was live at that event by category."""
        phase, step = self.peak_where
        return PeakReport(self.peak, phase, step, self.breakdown(self.peak_event))


@contextlib.contextmanager
def phases(tracker: LiveBytes, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> Iterator[None]:
    """Set ``tracker.phase`` from hooks (forward, backward, optimizer) and ``tracker.in_head`` from the lm_head's
    forward to the end of the model's (a gptcore GPT), and tag parameters, buffers, gradients and optimizer state.
    Backward is everything between the model's forward and the next optimizer step."""
    handles = []

    def forward_pre(*_) -> None:
        tracker.phase = "forward"

    def forward_post(*_) -> None:
        tracker.phase = "backward"
        tracker.in_head = False

    def head_pre(*_) -> None:
        tracker.in_head = True

    def step_pre(opt, *_) -> None:
        tracker.phase = "optimizer"
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    tracker.track(p.grad, GRADIENTS)

    def step_post(opt, *_) -> None:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    tracker.track(value, OPTIMIZER_STATE)
        # in-backward optimizers step inside backward; an ordinary step ends the iteration
        tracker.phase = "backward" if len(optimizers) > 1 else "idle"

    handles.append(model.register_forward_pre_hook(forward_pre))
    handles.append(model.register_forward_hook(forward_post))
    head = getattr(model, "lm_head", None)
    if head is not None:
        handles.append(head.register_forward_pre_hook(head_pre))
    for opt in optimizers:
        handles.append(opt.register_step_pre_hook(step_pre))
        handles.append(opt.register_step_post_hook(step_post))
    for p in model.parameters():
        tracker.track(p, PARAMETERS)
        if p.grad is not None:
            tracker.track(p.grad, GRADIENTS)
    for b in model.buffers():  # e.g. manual attention's causal masks: device memory like the parameters
        tracker.track(b, BUFFERS)
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def track_training(trainer, steps: int = 2, *, batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                   tracker: LiveBytes | None = None) -> PeakReport:
    """Run ``steps`` optimizer steps of ``trainer`` (a gptcore Trainer) under the tracker and report the peak.
    Two steps are the default so that optimizer state exists during the second. Not for compiled recipes.
    ``batches``: the full (x, y) batch of each step, consumed (default: ``steps`` batches drawn from the
    trainer's data); ``tracker``: the LiveBytes to use (default: a new one, rounding to 512 bytes on CUDA).
    The simulation passes both to run this same loop on fake tensors."""
    if trainer.recipe.compile:
        raise ValueError("compile: the storage tracker cannot see inside compiled kernels; track an eager recipe")
    if tracker is None:
        tracker = LiveBytes(round_to=512 if trainer.device.type == "cuda" else 1)
    if batches is None:
        micro = [trainer._next_batch() for _ in range(steps * trainer.accum)]  # made outside: not counted
        k = trainer.accum
        per_step = [micro[i * k:(i + 1) * k] for i in range(steps)]
        batches = [(torch.cat([x for x, _ in step]), torch.cat([y for _, y in step])) for step in per_step]
    with phases(tracker, trainer.model, trainer.optimizers), tracker:
        for step in range(len(batches)):
            tracker.step = step + 1
            trainer.step(batches.pop(0))  # popped: a step's batch dies after it, as in a training loop
    return tracker.report()
