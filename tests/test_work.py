"""The work ledger counts what a step does, the same on any thread count, and the gate fails a regression of each
kind planted in a copy of the step: an extra matmul (FLOPs), a host read of the loss (syncs), a graph break
(compile) and an extra copy of an activation (allocation traffic).

Every plant is made here, on the test's own Trainer (monkeypatched for the test only), never in gptcore."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptcore.config import Recipe
from gptcore.gate.schema import Entry, Tolerances
from gptcore.gate.verdicts import verdict_of
from gptcore.measure.runner import run_case
from gptcore.measure.work import compile_stats, count_step
from gptcore.presets import RECIPES
from gptcore.training.model import GPT
from gptcore.training.trainer import Trainer
from tests.helpers import TINY

pytestmark = pytest.mark.cpu

CPU = Tolerances.default_for("cpu")


def ledger_of(recipe: Recipe) -> dict:
    """The Measurement's work ledger of a short case on TINY, as the benchmarks record it."""
    m = run_case(TINY, recipe, "cpu", warmup=2, rounds=1, steps_per_round=1)
    assert m.error is None and m.work is not None
    return m.work


def entry(work: dict, peak: int | None = None) -> Entry:
    from gptcore.measure.work import WorkLedger

    return Entry(
        tokens_per_s=None,
        tokens_per_s_iqr=None,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=None,
        loss=None,
        loss_step=0,
        work=WorkLedger.from_json(work),
    )


def failed_metrics(now: dict, before: dict) -> set[str]:
    return {c.metric for c in verdict_of("case", entry(now), entry(before), CPU).failed}


def plant(monkeypatch: pytest.MonkeyPatch, change) -> None:
    """Apply ``change(model)`` to every GPT built from here on in this test (the Trainer builds its own)."""
    init = GPT.__init__

    def planted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        change(self)

    monkeypatch.setattr(GPT, "__init__", planted)


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "checkpoint", "optim-in-bwd", "grad-accum"])
def test_the_ledger_is_the_same_at_one_and_two_threads(recipe):
    threads = torch.get_num_threads()
    ledgers = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            t = Trainer(TINY, RECIPES[recipe], "cpu")
            t.step()
            ledgers.append(count_step(t).to_json())
    finally:
        torch.set_num_threads(threads)
    assert ledgers[0] == ledgers[1]


def test_an_extra_matmul_in_one_mlp_fails_on_flops(monkeypatch):
    before = ledger_of(RECIPES["fp32"])

    def extra_matmul(model: GPT) -> None:
        mlp = model.transformer.h[0].mlp
        width = 4 * TINY.n_embd

        def forward(x):
            h = mlp.gelu(mlp.c_fc(x))
            h = h @ torch.eye(width, dtype=h.dtype)  # exact: the numbers do not change
            return mlp.dropout(mlp.c_proj(h))

        mlp.forward = forward

    plant(monkeypatch, extra_matmul)
    now = ledger_of(RECIPES["fp32"])
    assert "flops" in failed_metrics(now, before)
    extra = 2 * TINY.batch_size * TINY.block_size * (4 * TINY.n_embd) ** 2  # B*T x 4C x 4C, multiply-adds x 2
    assert now["flops"]["forward"] - before["flops"]["forward"] == extra
    assert now["flops"]["backward"] - before["flops"]["backward"] == extra  # the input's gradient (eye needs none)


def test_a_host_read_of_the_loss_in_the_step_fails_on_syncs(monkeypatch):
    before = ledger_of(RECIPES["fp32"])
    assert before["syncs"] == 0
    step = Trainer.step

    def step_with_item(self, batch=None):
        loss = step(self, batch)
        loss.item()  # the planted sync
        return loss

    monkeypatch.setattr(Trainer, "step", step_with_item)
    now = ledger_of(RECIPES["fp32"])
    assert now["syncs"] == 1 and failed_metrics(now, before) == {"syncs", "op calls"}  # the read is an op too


def test_a_record_function_range_is_bookkeeping_and_no_work(monkeypatch):
    """torch.optim wraps its step and zero_grad in record_function ranges, whose enter and exit are operators of the
    profiler's namespace; a user's range around the step adds two more. None of them is work: planted around the
    step, the ledger does not move, and no phase lists one."""
    before = ledger_of(RECIPES["fp32"])
    step = Trainer.step

    def step_in_a_range(self, batch=None):
        with torch.autograd.profiler.record_function("planted range"):
            return step(self, batch)

    monkeypatch.setattr(Trainer, "step", step_in_a_range)
    now = ledger_of(RECIPES["fp32"])
    assert now == before and failed_metrics(now, before) == set()
    assert not [op for phase in now["ops"].values() for op in phase if op.startswith("profiler.")]


def test_the_naive_ladder_rung_makes_exactly_one_sync_and_the_next_none():
    assert ledger_of(RECIPES["ladder-0"])["syncs"] == 1
    assert ledger_of(dataclasses.replace(RECIPES["ladder-0"], sync_every_step=False))["syncs"] == 0
    assert ledger_of(RECIPES["fp16"])["syncs"] == 1  # GradScaler reads its inf flag with a foreach optimizer


@pytest.mark.slow
def test_a_graph_break_in_a_block_fails_the_compiled_case_on_graph_breaks(monkeypatch):
    before = ledger_of(RECIPES["compile-blocks"])
    assert before["compile"]["graph_breaks"] == 0 and before["compile"]["graphs"] >= 1
    assert before["compile"]["recompiles"] == 0

    def graph_break(model: GPT) -> None:
        block = model.transformer.h[0]
        forward = block.forward

        def broken(x):
            torch._dynamo.graph_break()  # what a print or a data-dependent branch does to the graph
            return forward(x)

        block.forward = broken

    plant(monkeypatch, graph_break)
    now = ledger_of(RECIPES["compile-blocks"])
    assert now["compile"]["graph_breaks"] >= 1
    assert "graph breaks" in failed_metrics(now, before)


class Tagged(torch.nn.Module):
    """A module whose forward reads a string attribute: Dynamo guards on its value, so a new value recompiles."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.tag = "first"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (2.0 if self.tag.endswith("!") else 1.0)


def test_a_frame_compiled_again_on_every_call_counts_each_recompilation_and_the_fall_back_to_eager():
    torch._dynamo.reset()
    module, x = Tagged(), torch.randn(2, 4)
    compiled = torch.compile(module, backend="eager")  # Dynamo's guards and cache alone: no inductor
    with compile_stats() as steady:
        for _ in range(3):
            compiled(x)  # the first call compiles; the same tag again passes the guards
    assert (steady.graphs, steady.recompiles) == (1, 0)
    limit = torch._dynamo.config.recompile_limit  # 8 on torch 2.13.0 and 2.15.0
    calls = limit + 4
    with compile_stats() as planted:
        for i in range(calls):
            module.tag = f"call {i}"  # the planted per-call attribute
            compiled(x)
    # the cache holds `limit` entries for the frame: the first and limit - 1 more compiled after a guard failed;
    # the next call's attempt hits the limit (recorded, a recompilation too) and runs the frame eagerly from then on,
    # as the last calls do without a record
    assert planted.recompiles == limit
    assert planted.graphs == limit - 1
    assert len(torch._dynamo.eval_frame._debug_get_cache_entry_list(Tagged.forward.__code__)) == limit
    torch._dynamo.reset()


def tagged_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a per-call attribute in a copy of the step: the model gets a new tag before every step, and its first
    block reads it, so each compiled step fails the guards of the step before."""

    def read_tag(model: GPT) -> None:
        block = model.transformer.h[0]
        forward = block.forward
        model.tag = "built"

        def tagged(x):
            return forward(x) if model.tag.endswith("!") else forward(x)  # the same numbers: Dynamo guards on it

        block.forward = tagged

    plant(monkeypatch, read_tag)
    step = Trainer.step

    def step_with_a_new_tag(self, batch=None):
        self.model.tag = f"step {self.step_count}"
        return step(self, batch)

    monkeypatch.setattr(Trainer, "step", step_with_a_new_tag)


@pytest.mark.slow
def test_a_per_call_attribute_on_the_compiled_gpt_fails_on_recompiles(monkeypatch):
    before = ledger_of(RECIPES["compile"])
    assert before["compile"]["recompiles"] == 0 and before["compile"]["graphs"] == 1  # steady: compiled once
    tagged_every_step(monkeypatch)
    now = ledger_of(RECIPES["compile"])
    # ledger_of runs 2 warm-up steps and 1 timed step, all compiled (the counted step runs eagerly under its
    # dispatch modes): a compile, then a recompilation in the warm-up and one in the timed step
    assert now["compile"]["recompiles"] == 2 and now["compile"]["graphs"] == 3
    assert {"recompiles", "graphs"} <= failed_metrics(now, before)
    with torch._dynamo.config.patch(recompile_limit=2):
        limited = ledger_of(RECIPES["compile"])
    # the third compiled step hits the limit: recorded as a recompilation, and the step runs eagerly
    assert limited["compile"]["recompiles"] == 2 and limited["compile"]["graphs"] == 2
    assert "recompiles" in failed_metrics(limited, before)


def test_an_extra_clone_of_an_activation_fails_on_allocation_traffic_and_a_kept_one_on_memory(monkeypatch):
    before = run_case(TINY, RECIPES["fp32"], "cpu", warmup=2, rounds=1, steps_per_round=1)

    def clone(model: GPT) -> None:
        mlp = model.transformer.h[0].mlp
        forward = mlp.forward

        def cloned(x):
            out = forward(x)
            mlp.kept = out.clone()  # copied, and kept alive until the next forward
            return out

        mlp.forward = cloned

    plant(monkeypatch, clone)
    now = run_case(TINY, RECIPES["fp32"], "cpu", warmup=2, rounds=1, steps_per_round=1)
    assert {"allocations", "allocated bytes"} <= failed_metrics(now.work, before.work)
    activation = TINY.batch_size * TINY.block_size * TINY.n_embd * 4
    assert now.work["allocated_bytes"] - before.work["allocated_bytes"] == activation
    assert now.peak_allocated_bytes > before.peak_allocated_bytes  # kept: the tracked peak grows too
    verdict = verdict_of(
        "case",
        entry(now.work, now.peak_allocated_bytes),
        entry(before.work, before.peak_allocated_bytes),
        dataclasses.replace(CPU, memory=0.0),
    )
    assert "peak memory" in {c.metric for c in verdict.failed}


def test_less_work_passes_with_a_refresh_note():
    before = ledger_of(RECIPES["checkpoint"])  # recomputes every block in backward
    now = ledger_of(RECIPES["fp32"])
    verdict = verdict_of("case", entry(now), entry(before), CPU)
    assert not verdict.failed and "refresh the baseline" in verdict.summary() and "flops" in verdict.summary()


def test_mfu_takes_the_counted_flops_only_where_they_differ_from_the_formula():
    # manual attention: every FLOP has a FlopCounterMode formula, and the count equals 6N + 12 L C T per token
    plain = run_case(TINY, RECIPES["ladder-0"], "cpu", warmup=1, rounds=1, steps_per_round=1)
    assert plain.flops_source == "analytic"
    assert sum(plain.work["flops"].values()) == GPT(TINY, RECIPES["ladder-0"]).flops_per_token() * plain.tokens_per_step
    # checkpointing recomputes the blocks' forward in backward (up to the last tensor backward needs): counted
    ckpt = run_case(
        TINY, dataclasses.replace(RECIPES["ladder-0"], checkpoint=True), "cpu", warmup=1, rounds=1, steps_per_round=1
    )
    assert ckpt.flops_source == "counted"
    assert ckpt.work["flops"]["forward"] == plain.work["flops"]["forward"]
    assert (
        plain.work["flops"]["backward"]
        < ckpt.work["flops"]["backward"]
        < (plain.work["flops"]["backward"] + plain.work["flops"]["forward"])
    )
