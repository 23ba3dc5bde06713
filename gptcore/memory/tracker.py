"""A lean tracker of live tensor-storage bytes: the peak, when it happened, and what was live at that moment.

``LiveBytes`` is a TorchDispatchMode that sees every op's outputs, so it works on real CPU tensors and on fake
tensors alike (same numbers). Each storage is followed with a weakref: allocation and free are numbered events,
and the breakdown at the peak is computed afterwards from those lifetimes, so tracking costs O(1) per new
storage. Categories (those of ``categories``): parameters, buffers, gradients and optimizer state are tagged by
the training hooks of ``phases``; autocast's copies of parameters are weight copies; what the forward allocates
from the lm_head on is logits and loss; what backward allocates with grad enabled inside the autograd engine
(checkpoint's recomputation) is recomputed activations; everything else is named after the phase that allocated
it. On CUDA, sizes round up to the caching allocator's 512-byte blocks, as max_memory_allocated counts them.
Not seen: what never passes the dispatcher. That is inductor's compiled code (its wrapper allocates its buffers
directly), a kernel's own scratch, and the Python numbers the argument parser wraps as 8-byte tensors, which
autograd may keep for backward (``x * 0.5``). The CPU allocator's count (``allocator``) sees them all; on CPU it is
the peak a case records, and this tracker's breakdown explains it.

Three things happen outside the dispatcher, and the tracker follows them while it is active:

* ``torch.get_rng_state()`` makes a tensor of the CPU generator's state (5,056 bytes), which non-reentrant
  checkpointing keeps for each checkpointed block until its recomputation;
* a storage resized in place (``untyped_storage().resize_``, FSDP2's free and re-allocation of a gathered
  parameter) ends its old allocation and starts one of the new size, in the same category;
* a c10d collective (every ``torch.ops.c10d`` op: ``torch.distributed``'s all-gather, reduce-scatter,
  all-reduce and broadcast, DDP's gradient all-reduce and its bucket-rebuild broadcast, FSDP2's all-gathers and
  reduce-scatters; and the functional collectives DTensor uses) runs on private, untracked copies of its tensors
  and completes before it returns; its results are copied into the caller's tensors. The backend's threads (gloo's)
  therefore never hold the last reference to a tracked storage, and every tracked storage is freed in the
  program's own order, so that the peak is the same on every run. Without this the free of a collective's buffer
  lands wherever gloo's thread happens to drop it (measured: DDP's 4-byte bucket-count broadcast at step 2 was
  sometimes still live at the peak under load).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from gptcore.memory.categories import (
    BUFFERS,
    GRADIENTS,
    LOGITS_AND_LOSS,
    OPTIMIZER_STATE,
    OTHER,
    PARAMETERS,
    PHASE_CATEGORY,
    RECOMPUTED,
    WEIGHT_COPIES,
    PeakReport,
    StorageRecord,
    breakdown,
)


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of live storages created by ops while active, plus those registered with ``track``."""

    def __init__(self, round_to: int = 1, counts_rng_state: bool = True) -> None:
        super().__init__()
        self.round_to = round_to
        self.counts_rng_state = counts_rng_state
        """Count ``torch.get_rng_state()``'s tensor: the device's memory on the CPU, host memory beside CUDA."""
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
        """storage -> a one-element slot holding its live record (None once freed or resized to nothing)"""
        self._records: list[StorageRecord] = []
        self._refs: list[weakref.ref] = []
        self._hidden: WeakIdKeyDictionary = WeakIdKeyDictionary()
        """Storages of the collectives' private copies: never counted, whatever op later returns a view of them."""
        self.waiting = 0
        """Set while a c10d Work's wait runs (see ``_outside_the_dispatcher``): its ops' outputs are not counted."""
        self._thread = threading.get_ident()
        self.foreign_frees = 0
        """Tracked storages freed by a thread other than the tracking one (0 unless a collective was missed)."""

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count ``t``'s storage if new; with ``category``, (re)tag it for its whole lifetime. A DTensor (FSDP2's
        sharded parameters, gradients and optimizer state) counts as this rank's local shard."""
        storage = getattr(t, "_local_tensor", t).untyped_storage()
        slot = self._storages.get(storage)
        if slot is None:
            if storage in self._hidden:
                return
            slot = self._storages[storage] = [None]
            self._refs.append(weakref.ref(storage, lambda _, s=slot: self._free(s)))
            self._allocate(slot, storage.nbytes(), category or self._category_of_new())
        elif category is not None and slot[0] is not None:
            slot[0].category = category

    def _hidden_copy(self, value):
        """A copy of a tensor that is never counted (anything else as it is), for a collective to work on."""
        if not isinstance(value, torch.Tensor):
            return value
        copy = value.clone()
        self._hidden[copy.untyped_storage()] = True
        return copy

    def resized(self, storage: torch.UntypedStorage) -> None:
        """``storage`` was resized in place: its allocation ends, and one of the new size (if any) begins in the
        same category. An untracked storage resized from nothing is a new allocation."""
        slot = self._storages.get(storage)
        if slot is None:
            if storage.nbytes() == 0:
                return
            slot = self._storages[storage] = [None]
            self._refs.append(weakref.ref(storage, lambda _, s=slot: self._free(s)))
            category = self._category_of_new()
        else:
            category = slot[0].category if slot[0] is not None else self._category_of_new()
            self._free(slot)
        if storage.nbytes():
            self._allocate(slot, storage.nbytes(), category)

    def _allocate(self, slot: list, nbytes: int, category: str) -> None:
        if self.round_to > 1:
            nbytes = -(-nbytes // self.round_to) * self.round_to
        self._event += 1
        slot[0] = record = StorageRecord(nbytes, category, self._event)
        self._records.append(record)
        self.live += nbytes
        self.allocated_bytes += nbytes
        if self.live > self.peak:
            self.peak, self.peak_event, self.peak_where = self.live, self._event, (self.phase, self.step)

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

    def _free(self, slot: list) -> None:
        record, slot[0] = slot[0], None
        if record is None:  # resized to nothing earlier
            return
        if threading.get_ident() != self._thread:
            # a storage the program had already let go of, dropped by another thread (a collective's); the
            # collectives are run on untracked copies while tracking, so this means one was missed
            self.foreign_frees += 1
        self._event += 1
        record.died = self._event
        self.live -= record.nbytes

    def __enter__(self) -> LiveBytes:
        self._thread = threading.get_ident()
        self._outside = _outside_the_dispatcher(self)
        self._outside.__enter__()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._outside.__exit__(None, None, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            out = _collective_in_program_order(func, args, kwargs or {}, self._hidden_copy)
        elif func.namespace == "_c10d_functional" and func is not torch.ops._c10d_functional.wait_tensor.default:
            out = _functional_collective_in_program_order(func, args, kwargs or {}, self._hidden_copy)
        else:
            out = func(*args, **(kwargs or {}))
        if self.waiting:
            return out
        # autocast's low-precision copy of a weight or bias
        self._copying_weight = (
            func is torch.ops.aten._to_copy.default
            and self.phase in ("forward", "backward")
            and isinstance(args[0], torch.nn.Parameter)
        )
        try:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.track(t)
        finally:
            self._copying_weight = False
        return out

    def live_at(self, event: int) -> dict[str, int]:
        """Live bytes per category just after ``event``."""
        return breakdown(self._records, event)

    def report(self) -> PeakReport:
        """Peak bytes, where they happened, and what was live at that event by category."""
        phase, step = self.peak_where
        return PeakReport(self.peak, phase, step, self.live_at(self.peak_event))


@contextlib.contextmanager
def _outside_the_dispatcher(tracker: LiveBytes) -> Iterator[None]:
    """While active, tell ``tracker`` about every in-place storage resize (they bypass the dispatcher), and keep
    what a c10d Work's ``wait`` runs out of its count: gloo finishes a reduce-scatter in ``wait`` with views of
    its own buffer and a copy into the caller's output, and counting that buffer would make its free, on gloo's
    thread, part of the peak."""
    original_resize = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int):
        out = original_resize(storage, size)
        tracker.resized(storage)
        return out

    import torch.distributed as dist

    work = None
    if dist.is_available():
        from torch._C._distributed_c10d import Work as work

        original_wait = work.wait

        def wait(self, *args, **kwargs):
            tracker.waiting += 1
            try:
                return original_wait(self, *args, **kwargs)
            finally:
                tracker.waiting -= 1

    original_get_rng_state = torch.get_rng_state

    def get_rng_state() -> torch.Tensor:  # a tensor made outside the dispatcher, which checkpoint keeps per block
        state = original_get_rng_state()
        if tracker.counts_rng_state:
            tracker.track(state)
        return state

    torch.UntypedStorage.resize_ = resize_
    torch.get_rng_state = get_rng_state
    if work is not None:
        work.wait = wait
    try:
        yield
    finally:
        del torch.UntypedStorage.resize_  # back to the C method it inherits
        torch.get_rng_state = original_get_rng_state
        if work is not None:
            work.wait = original_wait


def _collective_in_program_order(func, args, kwargs, private: Callable):
    """A c10d collective (``torch.ops.c10d.*``: what ``torch.distributed``'s functions, DDP's reducer and FSDP2
    issue) run on untracked copies of its tensors and waited for; what it writes is then copied into the caller's
    tensors, and it returns the caller's tensors with a completed Work. The backend's threads hold references to
    the copies only, so no tracked storage is ever freed by them. ``private``: the tracker's ``_hidden_copy``."""
    from torch._C._distributed_c10d import Work, _create_work_from_future

    with no_dispatch():
        private_args, private_kwargs = tree_map(private, args), tree_map(private, kwargs)
        out = func(*private_args, **private_kwargs)
        for leaf in tree_leaves(out):
            if isinstance(leaf, Work):
                leaf.wait()  # gloo finishes some collectives in wait (reduce-scatter: a split and copies)
        caller = {}  # id(copy) -> the caller's tensor
        schema = {a.name: a for a in func._schema.arguments}
        pairs = [
            *zip(func._schema.arguments, args, private_args),
            *((schema[k], kwargs[k], private_kwargs[k]) for k in kwargs),
        ]
        for arg, given, copies in pairs:
            for theirs, copy in zip(tree_leaves(given), tree_leaves(copies)):
                if not isinstance(theirs, torch.Tensor):
                    continue
                caller[id(copy)] = theirs
                if arg.alias_info is not None and arg.alias_info.is_write:
                    with torch.autograd._unsafe_preserve_version_counter(theirs):
                        theirs.copy_(copy)  # a backend writes its result as raw memory: no version bump
    done = torch.futures.Future()
    done.set_result([])

    def to_caller(value):  # the caller's tensors, and a Work whose wait does nothing (the real one ran its own)
        if isinstance(value, torch.Tensor):
            return caller.get(id(value), value)
        return _create_work_from_future(done) if isinstance(value, Work) else value

    return tree_map(to_caller, out)


def _functional_collective_in_program_order(func, args, kwargs, private: Callable):
    """A functional collective (DTensor's) on untracked copies, waited for; the caller gets an untracked-then-
    tracked copy of the result, so the work's own references are to untracked storages only."""
    wait = torch.ops._c10d_functional.wait_tensor.default
    with no_dispatch():
        out = func(*tree_map(private, args), **tree_map(private, kwargs))
        out = tree_map(lambda t: wait(t) if isinstance(t, torch.Tensor) else t, out)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)


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


def track_training(
    trainer,
    steps: int = 2,
    *,
    batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    tracker: LiveBytes | None = None,
    take_step: Callable[[tuple[torch.Tensor, torch.Tensor]], object] | None = None,
) -> PeakReport:
    """Run ``steps`` optimizer steps of ``trainer`` (a gptcore Trainer) under the tracker and report the peak.
    Two steps are the default so that optimizer state exists during the second. Not for compiled recipes.
    ``batches``: the full (x, y) batch of each step, consumed (default: each step's batch drawn from the
    trainer's data just before it, counted from then); ``tracker``: the LiveBytes to use (default: a new one,
    rounding to 512 bytes on CUDA). The simulation passes both to run this same loop on fake tensors.
    ``take_step``: what takes one step of a batch (default: ``trainer.step``; a benchmark case passes its own,
    which keeps the loss it reads)."""
    if trainer.recipe.compile:
        raise ValueError("compile: the storage tracker cannot see inside compiled kernels; track an eager recipe")
    if tracker is None:
        cuda = trainer.device.type == "cuda"
        tracker = LiveBytes(round_to=512 if cuda else 1, counts_rng_state=not cuda)
    with phases(tracker, trainer.model, trainer.optimizers), tracker:
        for step in range(steps if batches is None else len(batches)):
            tracker.step = step + 1
            tracker.phase = "idle"  # in-backward optimizers' last update leaves it in backward: a step starts idle
            # a step's batch dies after it, as in a training loop: no name here holds it
            (take_step or trainer.step)(batches.pop(0) if batches is not None else _batch_of(trainer, tracker))
    return tracker.report()


def _batch_of(trainer, tracker: LiveBytes) -> tuple[torch.Tensor, torch.Tensor]:
    """The next step's batch (``Trainer.step_batch``), made just before its step out of the tracker's sight and
    counted from then on as the step's data (category other); the CPU allocator counts it from the same moment."""
    with no_dispatch():
        batch = trainer.step_batch()
    for t in batch:
        tracker.track(t)
    return batch
