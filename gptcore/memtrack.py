"""A lean tracker of live tensor-storage bytes: the peak, when it happened, and what was live at that moment.

It is a TorchDispatchMode that sees every op's outputs, so it works on real CPU tensors and on fake tensors
alike (same numbers). Each storage is followed with a weakref: allocation and free are numbered events, and the
breakdown at the peak is computed afterwards from those lifetimes, so tracking costs O(1) per new storage.
Categories: parameters, gradients and optimizer state are tagged by the training hooks; everything else is named
after the phase that allocated it (forward: activations; backward: backward temporaries; optimizer: optimizer
temporaries). On CUDA, sizes round up to the caching allocator's 512-byte blocks, as max_memory_allocated counts.
Not seen: memory allocated inside compiled (inductor) kernels and inside single fused C++ kernels.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer state", "activations", "backward temporaries",
              "optimizer temporaries", "other")
_PHASE_CATEGORY = {"forward": "activations", "backward": "backward temporaries", "optimizer": "optimizer temporaries"}


@dataclass
class _Storage:
    nbytes: int
    category: str
    born: int
    died: int | None = None


@dataclass
class PeakReport:
    """The peak of live storage bytes, the phase and step it happened in, and its breakdown by category."""

    peak_bytes: int
    phase: str
    step: int
    by_category: dict[str, int] = field(default_factory=dict)


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
        self._event = 0
        self._storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._records: list[_Storage] = []
        self._refs: list[weakref.ref] = []

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count ``t``'s storage if new; with ``category``, (re)tag it for its whole lifetime."""
        st = t.untyped_storage()
        record = self._storages.get(st)
        if record is None:
            nbytes = st.nbytes()
            if self.round_to > 1:
                nbytes = -(-nbytes // self.round_to) * self.round_to
            self._event += 1
            record = _Storage(nbytes, category or _PHASE_CATEGORY.get(self.phase, "other"), self._event)
            self._storages[st] = record
            self._records.append(record)
            self._refs.append(weakref.ref(st, lambda _, r=record: self._free(r)))
            self.live += nbytes
            if self.live > self.peak:
                self.peak, self.peak_event, self.peak_where = self.live, self._event, (self.phase, self.step)
        elif category is not None:
            record.category = category

    def _free(self, record: _Storage) -> None:
        self._event += 1
        record.died = self._event
        self.live -= record.nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out

    def report(self) -> PeakReport:
        """Peak bytes, where they happened, and what was live at that event by category."""
        by = Counter()
        for r in self._records:
            if r.born <= self.peak_event and (r.died is None or r.died > self.peak_event):
                by[r.category] += r.nbytes
        phase, step = self.peak_where
        return PeakReport(self.peak, phase, step, {c: by[c] for c in CATEGORIES if by[c]})


@contextlib.contextmanager
def phases(tracker: LiveBytes, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> Iterator[None]:
    """Set ``tracker.phase`` from hooks (forward, backward, optimizer) and tag parameters, gradients and optimizer
    state. Backward is everything between the model's forward and the next optimizer step."""
    handles = []

    def forward_pre(*_):
        tracker.phase = "forward"

    def forward_post(*_):
        tracker.phase = "backward"

    def step_pre(opt, *_):
        tracker.phase = "optimizer"
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    tracker.track(p.grad, "gradients")

    def step_post(opt, *_):
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    tracker.track(value, "optimizer state")
        # in-backward optimizers step inside backward; an ordinary step ends the iteration
        tracker.phase = "backward" if len(optimizers) > 1 else "idle"

    handles.append(model.register_forward_pre_hook(forward_pre))
    handles.append(model.register_forward_hook(forward_post))
    for opt in optimizers:
        handles.append(opt.register_step_pre_hook(step_pre))
        handles.append(opt.register_step_post_hook(step_post))
    for p in model.parameters():
        tracker.track(p, "parameters")
        if p.grad is not None:
            tracker.track(p.grad, "gradients")
    for b in model.buffers():  # e.g. manual attention's causal masks: device memory like the parameters
        tracker.track(b, "buffers")
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
    gptcore.memory passes both to run this same loop on fake tensors."""
    if trainer.recipe.compile:
        raise ValueError("compile: the storage tracker cannot see inside compiled kernels; track an eager recipe")
    if tracker is None:
        tracker = LiveBytes(round_to=512 if trainer.device.type == "cuda" else 1)
    full = batches
    if full is None:
        micro = [trainer._next_batch() for _ in range(steps * trainer.accum)]  # made outside: not counted
        k = trainer.accum
        full = [(torch.cat([x for x, _ in micro[i * k:(i + 1) * k]]), torch.cat([y for _, y in micro[i * k:(i + 1) * k]]))
                for i in range(steps)]
    with phases(tracker, trainer.model, trainer.optimizers), tracker:
        for step in range(len(full)):
            tracker.step = step + 1
            trainer.step(full.pop(0))  # popped: a step's batch dies after it, as in a training loop
    return tracker.report()
