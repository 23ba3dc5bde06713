"""The work ledger of one training step: what it computes and what it asks of the machine, counted, not timed.

One steady-state optimizer step (after warm-up) runs under two dispatch modes, in a pass of its own that the timed
rounds never see:

* FLOPs per phase (forward, backward, optimizer), from the suite's own formulas (``gptcore.measure.flops``), the same on
  every torch release; what torch's FlopCounterMode would count for operators those formulas leave out is kept
  apart (``uncounted_flops_by_op``), so that a change in torch's counter is named as one;
* aten operator calls per phase (a proxy for kernel launches), and per phase every operator overload called with
  its count, so that a change names what moved (``gptcore.gate.checks.moved_ops``);
* host-device syncs: host reads of a tensor's value (``aten._local_scalar_dense``, which ``.item()`` and
  ``bool(tensor)`` dispatch) and copies from a GPU to the host, counted through the dispatcher so that they show
  on CPU too. The optimizers' own step counters, which PyTorch keeps on the host and reads there, are not syncs;
* allocation traffic: storages allocated during the step and their bytes (``memory.tracker.LiveBytes``), and
  the storages by the operator that allocated them (FLOPs too are kept by operator);
* under compile, over the warm-up in which compilation happens and the plain steps after it: Dynamo's graphs,
  graph breaks and recompilations (``recompilations``), and inductor's generated kernels.

Every figure is a count, the same on every CPU, thread count and instruction set, so the gate compares them
exactly (see ``gptcore.gate.baselines``).

Compiled recipes: the counted step runs eagerly, so their FLOPs, operator calls and allocations are those of the
eager step (measured: identical to the eager recipe's), and so is its loss. What compilation does is watched by the
compile counts, taken over the real compiled steps (``CompileWatch``). The step runs under Dynamo's ``force_eager``
stance (:func:`counted_step`): left to itself, Dynamo meets the dispatch mode, skips the frame, and marks its code
to run eagerly from then on, so every later step of the case (the GPU busy time's traced steps) would run eager.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gptcore.measure import flops as formulas
from gptcore.memory.tracker import LiveBytes, phases

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")
TOP_OPS = 8
OUTSIDE = "outside an operator"
"""Where allocations that no operator made are kept (in-place storage resizes, seen by the tracker directly)."""


@dataclass
class CompileStats:
    """What torch.compile did over a case's compiled steps: graphs, graph breaks, recompilations, kernels."""

    graphs: int
    graph_breaks: int
    recompiles: int
    kernels: int

    def __add__(self, other: CompileStats) -> CompileStats:
        return CompileStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


@dataclass
class WorkLedger:
    """The counted work of one optimizer step."""

    flops: dict[str, int]
    """FLOPs per phase."""
    op_calls: dict[str, int]
    """aten operators dispatched per phase."""
    syncs: int
    """Host reads of device values (see the module docstring)."""
    allocations: int
    """Storages allocated during the step."""
    allocated_bytes: int
    """Their bytes (CUDA: rounded to the caching allocator's 512-byte blocks)."""
    top_ops: list[tuple[str, int]] = field(default_factory=list)
    """The most called operators and their counts (reported, not gated)."""
    compile: CompileStats | None = None
    """Compiled recipes only."""
    ops: dict[str, dict[str, int]] | None = None
    """Per phase, every aten operator overload called and its count ('aten.mm.default': 63); None in entries
    recorded before the ledger kept them."""
    allocations_by_op: dict[str, int] | None = None
    """Storages allocated, by the operator that allocated them ('outside an operator': in-place resizes)."""
    flops_by_op: dict[str, int] | None = None
    """FLOPs by operator overload."""
    uncounted_flops_by_op: dict[str, int] | None = None
    """FLOPs torch's FlopCounterMode gives operators that ``gptcore.measure.flops`` has no formula for (not in
    ``flops``, never gated: when it moves, torch's counter changed, not the work)."""

    def by_op(self, metric: str) -> dict[str, int] | None:
        """The per-operator counts behind a gated total: 'op calls' (summed over phases), 'allocations', 'flops';
        None where the ledger has none."""
        if metric == "op calls" and self.ops is not None:
            total: Counter[str] = Counter()
            for counts in self.ops.values():
                total.update(counts)
            return dict(total)
        return {"allocations": self.allocations_by_op, "flops": self.flops_by_op}.get(metric)

    def gated(self) -> dict[str, int]:
        """The figures the gate compares exactly: totals, and the compile counts of compiled recipes."""
        figures = {
            "flops": sum(self.flops.values()),
            "op calls": sum(self.op_calls.values()),
            "syncs": self.syncs,
            "allocations": self.allocations,
            "allocated bytes": self.allocated_bytes,
        }
        if self.compile is not None:
            figures.update(
                {
                    "graphs": self.compile.graphs,
                    "graph breaks": self.compile.graph_breaks,
                    "recompiles": self.compile.recompiles,
                    "kernels": self.compile.kernels,
                }
            )
        return figures

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["top_ops"] = [list(pair) for pair in self.top_ops]
        for key in ("ops", "allocations_by_op", "flops_by_op", "uncounted_flops_by_op"):  # only non-zero counts,
            if data[key] is None:  # sorted: a file that diffs well
                del data[key]
        if self.ops is not None:
            data["ops"] = {phase: _nonzero(counts) for phase, counts in self.ops.items()}
        for key in ("allocations_by_op", "flops_by_op", "uncounted_flops_by_op"):
            if key in data:
                data[key] = _nonzero(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict) -> WorkLedger:
        """A recorded ledger: ValueError naming the field where a count is not an integer >= 0, KeyError where a
        figure is missing."""
        if not isinstance(data, dict):
            raise ValueError(f"work: expected an object, got {data!r}")
        compile_stats, top = data.get("compile"), data.get("top_ops", [])
        if not isinstance(top, list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in top):
            raise ValueError(f"work.top_ops: expected a list of [operator, count], got {top!r}")
        by_op = ("allocations_by_op", "flops_by_op")
        return cls(
            flops=_counts(data["flops"], "flops"),
            op_calls=_counts(data["op_calls"], "op_calls"),
            syncs=_count(data["syncs"], "syncs"),
            allocations=_count(data["allocations"], "allocations"),
            allocated_bytes=_count(data["allocated_bytes"], "allocated_bytes"),
            top_ops=[(str(name), _count(n, "top_ops")) for name, n in top],
            compile=CompileStats(**_counts(compile_stats, "compile")) if compile_stats else None,
            ops={phase: _counts(counts, f"ops.{phase}") for phase, counts in _items(data["ops"], "ops")}
            if "ops" in data
            else None,
            **{key: _counts(data[key], key) if key in data else None for key in by_op},
            uncounted_flops_by_op=_counts(data.get("uncounted_flops_by_op", {}), "uncounted_flops_by_op"),
        )


def _count(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"work.{path}: expected an integer >= 0, got {value!r}")
    return value


def _items(value: object, path: str) -> list[tuple[str, object]]:
    if not isinstance(value, dict):
        raise ValueError(f"work.{path}: expected an object, got {value!r}")
    return [(str(name), v) for name, v in value.items()]


def _counts(value: object, path: str) -> dict[str, int]:
    """``value`` as an object of name -> count (ValueError naming ``path`` otherwise)."""
    return {name: _count(n, f"{path}.{name}") for name, n in _items(value, path)}


def _nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in sorted(counts.items()) if n}


class _OpCounter(TorchDispatchMode):
    """Counts FLOPs, operator calls and syncs per phase (the phase is read from the tracker's hooks)."""

    def __init__(self, tracker: LiveBytes, host_counters: set[int]) -> None:
        super().__init__()
        self.tracker, self.host_counters = tracker, host_counters
        self.flops: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.by_phase: dict[str, Counter[str]] = {p: Counter() for p in PHASES}
        self.allocs: Counter[str] = Counter()
        self.flops_by_op: Counter[str] = Counter()
        self.uncounted: Counter[str] = Counter()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        allocated = self.tracker.allocations
        out = func(*args, **kwargs)  # the tracker (the mode below this one) counts what it allocates
        if func.namespace == "profiler":  # record_function markers: bookkeeping, no work
            return out
        name = str(func)
        self.allocs[name] += self.tracker.allocations - allocated
        phase = self.tracker.phase if self.tracker.phase in PHASES else "optimizer"  # after the step: its tail
        self.calls[phase] += 1
        packet = str(func.overloadpacket)
        self.ops[packet] += 1
        self.by_phase[phase][name] += 1
        flops = formulas.count(packet, args, kwargs)
        if flops is not None:
            self.flops[phase] += flops
            self.flops_by_op[name] += flops
        elif uncounted := formulas.uncounted(func, args, kwargs, out):
            self.uncounted[name] += uncounted
        if self._is_sync(func, args, kwargs):
            self.syncs += 1
        return out

    def _is_sync(self, func, args, kwargs) -> bool:
        if func is torch.ops.aten._local_scalar_dense.default:
            return id(args[0]) not in self.host_counters
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            target = args[0].device if func is torch.ops.aten.copy_.default else kwargs.get("device")
            return (
                isinstance(source, torch.Tensor)
                and source.device.type == "cuda"
                and target is not None
                and torch.device(target).type == "cpu"
            )
        return False


def _host_step_counters(optimizers: list[torch.optim.Optimizer]) -> set[int]:
    """ids of the optimizers' step-count tensors that live on the host (read there by design, not a sync)."""
    return {
        id(state["step"])
        for opt in optimizers
        for state in opt.state.values()
        if isinstance(state.get("step"), torch.Tensor) and state["step"].device.type == "cpu"
    }


def count_step(trainer, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> WorkLedger:
    """The work ledger of one ``trainer.step(batch)`` (a gptcore Trainer, warmed up so that optimizer state and
    compiled graphs exist). The step is taken: the trainer is one step further afterwards."""
    return counted_step(trainer, batch)[0]


def _without_dynamo() -> AbstractContextManager:
    """Dynamo's ``force_eager`` stance: compiled code runs eagerly and Dynamo is not called. Under a dispatch mode
    Dynamo itself would skip the frame and mark its code to skip for good (torch 2.11 to 2.15), so that every later
    step of the case ran eager. A torch before 2.6 has no stances: nothing."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else nullcontext()


def counted_step(trainer, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[WorkLedger, torch.Tensor]:
    """``count_step``, with the loss the step returned (the modes only count: the loss of a plain eager step, bit
    for bit; a compiled recipe's step runs eagerly here)."""
    if batch is None:  # made outside the counted step, as a DataLoader would
        batch = trainer.step_batch()
    tracker = LiveBytes(round_to=512 if trainer.device.type == "cuda" else 1)
    counts = _OpCounter(tracker, _host_step_counters(trainer.optimizers))
    with phases(tracker, trainer.model, trainer.optimizers):
        before, before_bytes = tracker.allocations, tracker.allocated_bytes
        with _without_dynamo(), tracker, counts:
            loss = trainer.step(batch)
    allocations = tracker.allocations - before
    by_op = dict(counts.allocs)
    outside = allocations - sum(by_op.values())  # in-place storage resizes bypass the dispatcher
    if outside:
        by_op[OUTSIDE] = outside
    return WorkLedger(
        flops={p: counts.flops[p] for p in PHASES},
        op_calls={p: counts.calls[p] for p in PHASES},
        syncs=counts.syncs,
        allocations=allocations,
        allocated_bytes=tracker.allocated_bytes - before_bytes,
        top_ops=counts.ops.most_common(TOP_OPS),
        ops={p: dict(counts.by_phase[p]) for p in PHASES},
        allocations_by_op=by_op,
        flops_by_op=dict(counts.flops_by_op),
        uncounted_flops_by_op=dict(counts.uncounted),
    ), loss


RECORDS_KEPT = 1 << 30
"""How many of Dynamo's compilation records ``compile_stats`` keeps while it counts (Dynamo keeps the last 64; a
block that compiled more would lose some of its recompilations)."""


def recompilations(records: list) -> int:
    """How many of Dynamo's compilation records (``torch._dynamo.utils.CompilationMetrics``) are recompilations.

    Dynamo writes one record for every attempt to compile a frame, and sets its ``recompile_reason`` exactly when
    ``torch._dynamo.cache_size.is_recompilation`` holds: the frame's code object already had a compiled entry, and
    its guards failed on this call (the reason is the first guard that failed). The attempt that hits
    ``config.recompile_limit`` is one of them: Dynamo records it (failed, 'Unsupported') before it runs the frame
    eagerly from then on; later calls of that frame compile nothing and record nothing. So a frame compiled again
    on every call counts each recompilation up to the limit, the fall-back to eager included. The same on torch
    2.13.0 and 2.15.0 (``convert_frame._compile``). ``counters["recompiles"]``, which this ledger read before, is
    written by nothing in either release."""
    return sum(1 for record in records if getattr(record, "recompile_reason", None) is not None)


class CompileWatch:
    """Dynamo's and inductor's counts from the moment it is made until ``stop``: graphs compiled
    (``counters["stats"]["unique_graphs"]``), graph breaks, recompilations (``recompilations`` of the compilation
    records Dynamo wrote meanwhile: a frame compiled again after its guards failed, the fall-back to eager at the
    recompile limit included) and generated kernels.

    The counted step runs eagerly (``counted_step``), so a watch over it alone would always read 0: a steady state
    is watched over plain steps."""

    def __init__(self) -> None:
        from torch._dynamo import utils as dynamo

        self._dynamo = dynamo
        self._kept = dynamo._compilation_metrics.maxlen  # the ring's size, given back by ``stop``
        dynamo.set_compilation_metrics_limit(RECORDS_KEPT)  # nothing recorded meanwhile falls off the ring
        self._already = len(dynamo.get_compilation_metrics())
        self._start = self._snapshot()
        self.stats: CompileStats | None = None

    def _snapshot(self) -> tuple[int, int, int]:
        from torch._inductor import metrics

        counters = self._dynamo.counters
        return (
            counters["stats"]["unique_graphs"],
            sum(counters["graph_break"].values()),
            metrics.generated_kernel_count,
        )

    def stop(self) -> CompileStats:
        """What was compiled since the watch began (the same figures on every later call)."""
        if self.stats is None:
            graphs, breaks, kernels = (b - a for a, b in zip(self._start, self._snapshot()))
            recompiles = recompilations(self._dynamo.get_compilation_metrics()[self._already :])
            self._dynamo.set_compilation_metrics_limit(self._kept or self._dynamo.DEFAULT_COMPILATION_METRICS_LIMIT)
            self.stats = CompileStats(graphs, breaks, recompiles, kernels)
        return self.stats


@contextmanager
def compile_stats() -> Iterator[CompileStats]:
    """A ``CompileWatch`` over the block: the CompileStats it yields are filled in when the block ends."""
    result = CompileStats(0, 0, 0, 0)
    watch = CompileWatch()
    try:
        yield result
    finally:
        result.graphs, result.graph_breaks, result.recompiles, result.kernels = dataclasses.astuple(watch.stop())
