"""The partitioner's plan (gptcore.memory.partition) reads what the compiled step really saves and walks live bytes
the way a graph runs; the peak of a CUDA allocator trace (gptcore.memory.snapshot) is found and explained by line."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from gptcore.config import Recipe
from gptcore.memory.partition import _storages, live_peak, plan
from gptcore.memory.snapshot import peak_of_trace
from tests.helpers import TINY, batches, trainer

pytestmark = [pytest.mark.cpu, pytest.mark.slow]

ONE_LAYER = dataclasses.replace(TINY, n_layer=1)


def saved_activation_bytes(recipe: Recipe) -> int:
    """Bytes of the distinct storages one compiled forward makes and saves for backward (not its parameters or
    batch), as the saved-tensor hooks see them at run time."""
    t = trainer(recipe, n_layer=1)
    x, y = batches(1)[0]
    params = {p.untyped_storage().data_ptr() for p in [*t.model.parameters(), x, y]}
    saved: dict[int, int] = {}

    def pack(v: torch.Tensor) -> torch.Tensor:
        if v.untyped_storage().data_ptr() not in params:
            saved[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
        return v

    with t.numerics(), torch.autograd.graph.saved_tensors_hooks(pack, lambda v: v):
        loss = t.forward(x, y)[1]
    loss.backward()
    return sum(saved.values())


@pytest.mark.parametrize("budget", [None, 0.5, 0.0])
def test_the_plan_saves_for_backward_exactly_what_the_compiled_step_saves(budget):
    recipe = Recipe(compile=True, memory_budget=budget)
    planned = plan(ONE_LAYER, recipe)
    assert planned.saved_bytes == saved_activation_bytes(recipe)


def test_a_lower_budget_saves_less_and_recomputes_more():
    full, half, none = (plan(ONE_LAYER, Recipe(compile=True, memory_budget=b)) for b in (None, 0.5, 0.0))
    assert none.saved_bytes < half.saved_bytes < full.saved_bytes
    assert none.recomputed_ops > half.recomputed_ops > full.recomputed_ops
    x, y = batches(1)[0]
    inputs = 4 * sum(p.numel() for p in trainer(Recipe(), n_layer=1).model.parameters()) + 8 * (x.numel() + y.numel())
    assert full.input_bytes == half.input_bytes == none.input_bytes == inputs  # float32 weights, int64 tokens


def test_a_recipe_without_a_whole_model_compile_has_no_plan():
    for recipe in (Recipe(), Recipe(compile=True, compile_scope="blocks")):
        with pytest.raises(ValueError, match="there is no partition to plan"):
            plan(ONE_LAYER, recipe)


def test_live_bytes_are_walked_in_graph_order_with_views_sharing_their_base():
    def step(x: torch.Tensor) -> torch.Tensor:
        a = x * 2  # 400 B, read by b and by the view v
        b = a + 1  # 400 B: a and b live together (800), then a dies after v's last read
        v = a.view(10, 10)
        c = v.sum() + b.sum()  # scalars of 4 B each
        return c

    graph = make_fx(step, tracing_mode="fake")(torch.ones(100)).graph
    inputs = {n for n in graph.nodes if n.op == "placeholder"}
    leave_out = frozenset(s for n in inputs for s in _storages(n))
    peak, _, out_bytes = live_peak(graph, leave_out)
    assert peak == 400 + 400 + 4  # a, b and v.sum() live together; the output (4 B) is born after b.sum()
    assert out_bytes == 0


def _walked(step) -> tuple[int, float, int]:
    """``live_peak`` of ``step``'s graph on 100 floats, its input left out."""
    graph = make_fx(step, tracing_mode="fake")(torch.ones(100)).graph
    return live_peak(graph, frozenset(s for n in graph.nodes if n.op == "placeholder" for s in _storages(n)))


def test_a_storage_lives_to_the_last_read_of_its_base_or_of_any_view_and_the_peak_is_where_it_is_first_reached():
    def base_read_after_its_view(x: torch.Tensor) -> torch.Tensor:
        a = x * 2  # 400 B
        s = a.view(10, 10).sum()  # the view's last read; 4 B
        b = a + 1  # a is read again after its view: a, s and b live together
        return s + b.sum()

    assert _walked(base_read_after_its_view) == (400 + 4 + 400, 4 / 7, 0)  # at `add`, node 4 of 0..7

    def the_same_peak_twice(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x * 2  # 400 B
        total = a.sum()  # 404 B live (a dies after this read), node 2 of 0..4
        b = x * 3  # 404 B live again: total and b, both outputs
        return total, b

    assert _walked(the_same_peak_twice) == (404, 2 / 4, 4)  # the first moment: only `total` of the outputs is live


def test_the_peak_of_an_allocator_trace_and_what_was_live_at_it_by_line():
    gpt = [{"filename": "/x/gptcore/training/model.py", "line": 7, "name": "forward"}, {"filename": "/t/torch/nn.py"}]
    opt = [{"filename": "/t/torch/optim/adamw.py", "line": 3, "name": "step"}]
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": gpt},
        {"action": "alloc", "addr": 2, "size": 300, "frames": opt},
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 1, "size": 100},  # only a completed free gives the bytes back
        {"action": "alloc", "addr": 3, "size": 50, "frames": gpt},
        {"action": "alloc", "addr": 4, "size": 60, "frames": gpt},  # the peak: 300 + 50 + 60 = 410 B
        {"action": "free_completed", "addr": 4, "size": 60},
        {"action": "oom", "size": 1000, "device_free": 20},
    ]
    peak = peak_of_trace(trace)
    assert (peak.peak_bytes, peak.at_event, peak.events) == (410, 5, 8)
    assert peak.oom == "requested 1,000 B with 20 B free, 350 B allocated"
    assert [(s.where, s.blocks, s.bytes) for s in peak.sites] == [
        ("optim/adamw.py:3 step", 1, 300),
        ("gptcore/training/model.py:7 forward", 2, 110),
    ]


def test_a_trace_keeps_its_first_oom_the_first_moment_of_its_peak_the_innermost_frame_and_its_top_sites():
    """Where no frame is gptcore's the innermost one names the site, an allocation without a stack says so, a later
    moment as high as the peak does not move it, the first out-of-memory event is the one kept, and ``top`` cuts
    the sites."""
    inner = {"filename": "/t/torch/nn/functional.py", "line": 9, "name": "linear"}
    outer = {"filename": "/u/user/script.py", "line": 1, "name": "main"}
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": [inner, outer]},
        {"action": "alloc", "addr": 2, "size": 40},  # the peak: 140 B
        {"action": "oom", "size": 1000, "device_free": 20},
        {"action": "free_completed", "addr": 2, "size": 40},
        {"action": "alloc", "addr": 3, "size": 40, "frames": [outer]},  # 140 B again
        {"action": "oom", "size": 5000, "device_free": 0},
    ]
    peak = peak_of_trace(trace)
    assert (peak.peak_bytes, peak.at_event, peak.events) == (140, 1, 6)
    assert peak.oom == "requested 1,000 B with 20 B free, 140 B allocated"
    assert [(s.where, s.blocks, s.bytes) for s in peak.sites] == [
        ("nn/functional.py:9 linear", 1, 100),
        ("(no stack recorded)", 1, 40),
    ]
    assert [s.where for s in peak_of_trace(trace, top=1).sites] == ["nn/functional.py:9 linear"]
