"""What torch.compile's partitioner plans for one training step: the bytes the compiled forward saves for backward
and the peak of live bytes along the forward and backward graphs, for a recipe with ``compile`` (and its memory
budget).

The plan is read from the graphs AOTAutograd's min-cut partitioner returns to inductor, captured by wrapping the
partitioner inductor calls; compilation then stops, so no kernel is generated and no step runs (a 1.6B model is
planned in about a minute on 2 CPU cores). Live bytes are walked in the graphs' node order from each node's fake
tensor: a storage lives from the node that makes it to the last node that reads it (or to the end, for a graph
output: saved activations in the forward, gradients in the backward). The forward's inputs (parameters and the
batch) are left out and reported apart.
This is the partitioner's plan, before inductor: its fusion keeps some intermediates out of memory and its scheduler
may reorder nodes, so the real peak of a compiled step differs; a plan whose backward peaks far above the forward,
or above what eager saves, points at the partitioner rather than at the code around it. The decompositions are
those of the device the model is on (CUDA's attention kernels save other tensors than the CPU's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef

from gptcore.config import GPTConfig, Recipe

MATMULS = ("mm", "addmm", "bmm", "baddbmm")


@dataclass(frozen=True)
class PartitionPlan:
    """The partitioner's plan for one forward/backward (bytes; fractions of the backward graph's nodes)."""

    input_bytes: int
    """The forward's inputs: parameters and the batch."""
    saved_bytes: int
    """Activations the forward makes and saves for backward (its inputs excluded)."""
    forward_peak_bytes: int
    """Peak of live bytes along the forward graph, inputs excluded (saved activations accumulate to its end)."""
    backward_peak_bytes: int
    """Peak of live bytes along the backward graph, the forward's inputs excluded: saved and recomputed
    activations, gradients."""
    backward_peak_at: float
    """Where in the backward graph the peak is: 0 at its first node, 1 at its last."""
    gradients_at_backward_peak: int
    recomputed_ops: int
    """Forward ops that the backward graph runs again."""
    recomputed_matmuls: int


class _Planned(Exception):
    """Raised from the wrapped partitioner once the plan is read: compilation stops there."""


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _storages(node: fx.Node) -> dict[StorageWeakRef, int]:
    return {StorageWeakRef(t.untyped_storage()): t.untyped_storage().nbytes() for t in _tensors(node.meta.get("val"))}


def live_peak(graph: fx.Graph, leave_out: frozenset[StorageWeakRef]) -> tuple[int, float, int]:
    """(peak live bytes, where it is as a fraction of the nodes, bytes of graph outputs live at it) along
    ``graph``'s node order, storages in ``leave_out`` not counted. Views share their base's storage."""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    last_read = {n: index[n] for n in nodes}
    for n in nodes:
        for arg in n.all_input_nodes:
            last_read[arg] = index[n]
    outputs = {s for n in nodes if n.op == "output" for arg in n.all_input_nodes for s in _storages(arg)}
    size: dict[StorageWeakRef, int] = {}
    born: dict[StorageWeakRef, int] = {}
    dies: dict[StorageWeakRef, float] = {}
    for n in nodes:
        for s, nbytes in _storages(n).items():
            if s in leave_out:
                continue
            size[s] = nbytes
            born[s] = min(born.get(s, index[n]), index[n])
            dies[s] = len(nodes) if s in outputs else max(dies.get(s, 0), last_read[n] + 0.5)
    events = [(born[s], size[s], s in outputs) for s in size] + [(dies[s], -size[s], s in outputs) for s in size]
    events.sort(key=lambda e: (e[0], e[1] < 0))  # at one position, what is made counts before what dies
    live = peak = out_live = out_at_peak = 0
    peak_at = 0.0
    for at, delta, is_output in events:
        live += delta
        out_live += delta if is_output else 0
        if live > peak:
            peak, peak_at, out_at_peak = live, at, out_live
    return peak, min(peak_at / max(len(nodes) - 1, 1), 1.0), out_at_peak


def read_plan(fw: fx.GraphModule, bw: fx.GraphModule) -> PartitionPlan:
    """The PartitionPlan of a partitioned forward and backward graph."""
    inputs: dict[StorageWeakRef, int] = {}
    for n in fw.graph.nodes:
        if n.op == "placeholder":
            inputs.update(_storages(n))
    saved: dict[StorageWeakRef, int] = {}
    for n in bw.graph.nodes:
        if n.op == "placeholder" and not n.name.startswith("tangents"):
            saved.update(_storages(n))
    fw_peak, _, _ = live_peak(fw.graph, frozenset(inputs))
    bw_peak, bw_at, grads = live_peak(bw.graph, frozenset(inputs))
    fw_ops = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    again = [n for n in bw.graph.nodes if n.op == "call_function" and n.name in fw_ops]
    matmuls = [n for n in again if getattr(n.target, "__name__", "").split(".")[0] in MATMULS]
    return PartitionPlan(
        input_bytes=sum(inputs.values()),
        saved_bytes=sum(b for s, b in saved.items() if s not in inputs),
        forward_peak_bytes=fw_peak,
        backward_peak_bytes=bw_peak,
        backward_peak_at=bw_at,
        gradients_at_backward_peak=grads,
        recomputed_ops=len(again),
        recomputed_matmuls=len(matmuls),
    )


@contextlib.contextmanager
def _capture(plans: list[PartitionPlan]) -> Iterator[None]:
    import torch._inductor.compile_fx as compile_fx

    original = getattr(compile_fx, "min_cut_rematerialization_partition", None)
    if original is None:
        raise RuntimeError(
            f"torch {torch.__version__}: inductor's partitioner is not where this module looks for it "
            f"(torch._inductor.compile_fx.min_cut_rematerialization_partition)"
        )

    def partition(joint: fx.GraphModule, inputs, **kwargs):
        fw, bw = original(joint, inputs, **kwargs)
        plans.append(read_plan(fw, bw))
        raise _Planned

    compile_fx.min_cut_rematerialization_partition = partition
    try:  # a cached compile skips the partitioner
        with functorch_config.patch(enable_autograd_cache=False), inductor_config.patch(fx_graph_cache=False):
            yield
    finally:
        compile_fx.min_cut_rematerialization_partition = original


def check_plannable(recipe: Recipe, name: str = "the recipe") -> None:
    """Raise ValueError unless ``recipe`` (called ``name`` in the message) compiles the whole model: only then is
    there one partition to plan."""
    if not recipe.compile or recipe.compile_scope != "model":
        raise ValueError(
            f"{name} does not compile the whole model (compile=True, compile_scope='model'): "
            f"there is no partition to plan"
        )


def plan(cfg: GPTConfig, recipe: Recipe, device: torch.device | str = "cpu") -> PartitionPlan:
    """The partitioner's plan for one micro-batch of ``cfg`` under ``recipe`` (compile over the whole model) on
    ``device``: the Trainer's own model, autocast and memory budget, compiled until the partition and no further."""
    from gptcore.training.trainer import Trainer

    check_plannable(recipe)
    trainer = Trainer(cfg, recipe, device)
    x, y = trainer.batches("train")[0]
    plans: list[PartitionPlan] = []
    with _capture(plans), trainer.numerics(), trainer.autocast():
        try:
            trainer.forward(x.to(trainer.device), y.to(trainer.device))
        except Exception:  # _Planned, wrapped by Dynamo as a backend failure
            if not plans:
                raise
    torch._dynamo.reset()  # the aborted compile leaves nothing usable behind
    if not plans:
        raise RuntimeError("the compiled forward ran without partitioning (no backward needed?)")
    return plans[0]
