"""The work ledger's FLOPs come from formulas the suite owns (gptcore.measure.flops): each equals torch's registry
wherever torch has a formula (the fused attention backwards less their recomputation of the scores), every attention
kernel counts what the math path dispatches, cpu-small's step equals the analytic count with attention, and a formula
torch adds or drops moves no FLOPs: it is named as the counter's change."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

from gptcore.gate import checks, verdicts
from gptcore.gate.schema import Entry, Tolerances
from gptcore.measure import flops
from gptcore.measure.work import WorkLedger, count_step
from gptcore.presets import MODELS, RECIPES
from gptcore.training.trainer import Trainer
from tests.helpers import TINY

pytestmark = pytest.mark.cpu

B, H, S, D = 2, 3, 8, 4
"""Small attention shapes, each dimension distinct so that a formula that swaps two of them fails."""


def sample_args(packet: str) -> tuple:
    """Arguments of one call of ``packet`` on meta tensors (shapes are all a formula reads)."""

    def t(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device="meta")

    q, k, v = t(B, H, S, D), t(B, H, S + 1, D), t(B, H, S + 1, D + 2)
    return {
        "aten.mm": (t(5, 6), t(6, 7)),
        "aten.addmm": (t(7), t(5, 6), t(6, 7)),
        "aten.bmm": (t(2, 5, 6), t(2, 6, 7)),
        "aten.baddbmm": (t(2, 5, 7), t(2, 5, 6), t(2, 6, 7)),
    }.get(packet, (t(B, H, S, D + 2), q, k, v) if packet.endswith("_backward") else (q, k, v))


def test_every_formula_equals_torchs_wherever_torch_has_one() -> None:
    compared = []
    for packet in flops.FORMULAS:
        op = getattr(torch.ops.aten, packet.removeprefix("aten."), None)
        theirs_formula = flop_counter.flop_registry.get(op) if op is not None else None
        if theirs_formula is None:  # torch 2.13 has none for CPU flash attention: held to the math path below
            continue
        args = sample_args(packet)
        ours = flops.count(packet, args, {})
        theirs = theirs_formula(*args, out_val=None)
        if packet.endswith("attention_backward") or packet.endswith("attention_for_cpu_backward"):
            # torch's fused backwards also count recomputing the scores q @ kᵀ (2 b h s_q s_k d); the suite does not
            theirs -= 2 * B * H * S * (S + 1) * D
        assert ours == theirs, packet
        compared.append(packet)
    assert {
        "aten.mm",
        "aten.addmm",
        "aten.bmm",
        "aten.baddbmm",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_efficient_attention_backward",
    } <= set(compared)


class _Ours(TorchDispatchMode):
    """Sums gptcore.measure.flops over what is dispatched, and notes which operators ran."""

    def __init__(self) -> None:
        super().__init__()
        self.flops, self.ops = 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.add(str(func.overloadpacket))
        self.flops += flops.count(str(func.overloadpacket), args, kwargs) or 0
        return func(*args, **kwargs)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_flash_attention_counts_what_the_math_path_dispatches(causal: bool) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))

    def step(backend: SDPBackend) -> None:
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

    with flop_counter.FlopCounterMode(display=False) as torch_counts:  # the math path: bmms torch counts exactly
        step(SDPBackend.MATH)
    with _Ours() as ours:
        step(SDPBackend.FLASH_ATTENTION)
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward" in ours.ops  # the fused kernel ran
    assert ours.flops == torch_counts.get_total_flops() == 12 * B * H * S * S * D  # 4 forward, 8 backward


def test_cpu_small_flops_equal_the_analytic_count_attention_included() -> None:
    cfg, recipe = MODELS["cpu-small"], RECIPES["fp32"]
    trainer = Trainer(cfg, dataclasses.replace(recipe, attention="sdpa"), "cpu")
    trainer.step()  # optimizer state exists: a steady step
    ledger = count_step(trainer)
    tokens = recipe.tokens_per_step(cfg)
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ledger.flops_by_op
    attention = 12 * cfg.n_layer * cfg.n_embd * cfg.block_size * tokens
    assert sum(ledger.flops.values()) == trainer.model.flops_per_token() * tokens
    assert (
        ledger.flops_by_op["aten._scaled_dot_product_flash_attention_for_cpu.default"]
        + ledger.flops_by_op["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"]
        == attention
    )
    assert ledger.flops["optimizer"] == 0 and ledger.uncounted_flops_by_op == {}


def _ledger() -> WorkLedger:
    torch.manual_seed(0)
    trainer = Trainer(TINY, RECIPES["fp32"], "cpu")
    trainer.step()
    return count_step(trainer)


@pytest.mark.parametrize("change", ["removed", "added"])
def test_a_formula_torch_adds_or_drops_moves_no_flops_and_is_named_as_the_counters(monkeypatch, change) -> None:
    before = _ledger()
    registry = dict(flop_counter.flop_registry)
    if change == "removed":  # a release without a matmul formula
        del registry[torch.ops.aten.mm]
        del registry[torch.ops.aten.addmm]
    else:  # a release that counts one FLOP an element for every addition
        registry[torch.ops.aten.add] = lambda *args, out_val=None, **kwargs: out_val.numel()
    monkeypatch.setattr(flop_counter, "flop_registry", registry)
    now = _ledger()
    assert (now.flops, now.flops_by_op, now.op_calls) == (before.flops, before.flops_by_op, before.op_calls)
    if change == "added":
        assert now.uncounted_flops_by_op.get("aten.add.Tensor", 0) > 0
        entry = Entry(
            tokens_per_s=None,
            tokens_per_s_iqr=None,
            peak_allocated_bytes=1,
            peak_reserved_bytes=None,
            loss=1.0,
            loss_step=1,
            precision="fp32",
            work=now,
        )
        verdict = verdicts.verdict_of(
            "c", entry, dataclasses.replace(entry, work=before), Tolerances.default_for("cpu"), strict=True
        )
        coverage = next(c for c in verdict.checks if c.metric == "flop coverage")
        assert not verdict.failed and coverage.status == checks.CHANGED
        assert verdict.summary().startswith("ok (the FLOP counter changed, not the work")
        assert any(c.metric == "work" and c.status == checks.OK for c in verdict.checks)  # the end table's "="
        assert coverage.note.startswith(
            "the FLOP counter changed, not the work: torch's FlopCounterMode now counts aten.add.Tensor"
        )
    else:
        assert now.uncounted_flops_by_op == before.uncounted_flops_by_op == {}


def test_a_torch_formula_that_cannot_take_the_arguments_counts_nothing(monkeypatch) -> None:
    """torch's registry is kept beside the ledger for what the suite has no formula for; a formula of a new torch
    that raises on a call's arguments leaves that call uncounted instead of failing the case."""

    def refuses(*args, **kwargs):
        raise TypeError("unexpected keyword argument 'out_val'")

    func = torch.ops.aten.mm.default
    monkeypatch.setitem(flop_counter.flop_registry, func.overloadpacket, refuses)
    a = torch.ones(2, 3)
    assert flops.uncounted(func, (a, a.T), {}, a @ a.T) is None
