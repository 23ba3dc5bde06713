"""Each precision proven directly: the dispatcher sees every matmul and attention kernel of a training step
(forward, backward and optimizer) run in the recipe's dtype, and pure bf16 keeps its weights, gradients and
optimizer state in bf16.

A loss close to fp32's cannot show this (fp32 is close to fp32: with autocast dropped, the training tests pass), so
the operands' dtypes are read where the kernels are chosen, in a TorchDispatchMode below autocast. Dropping
autocast in a copy of the trainer fails the test named for its dtype (the last tests here). On CPU, torch 2.13.0's
autocast runs float16 as well as bfloat16 (measured: fp16 matmuls on this CPU), so the fp16 recipe is proven on CPU
too; CUDA's autocast puts the same operators (mm, addmm, bmm, baddbmm, attention) in its lower-precision list."""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gptcore.config import Recipe
from gptcore.training.trainer import Trainer
from tests.helpers import TINY, batches, run_pytest

pytestmark = pytest.mark.cpu

HERE = Path(__file__).resolve()
MATMULS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "scaled_dot_product")
"""Operators that multiply matrices, by name (aten.mm, aten._scaled_dot_product_flash_attention_for_cpu_backward,
...): every operator whose name holds one of these is checked."""
STATISTICS = {"logsumexp"}
"""Operands that every attention kernel keeps in float32 whatever the inputs' dtype (softmax's log-sum-exp, saved
for backward): not a matmul's operand."""
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class MatmulDtypes(TorchDispatchMode):
    """Counts (operator, dtype) over the floating-point operands of every matmul and attention kernel dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, torch.dtype]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if any(m in name for m in MATMULS):
            values = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
            for arg, value in values.items():
                if isinstance(value, torch.Tensor) and value.is_floating_point() and arg not in STATISTICS:
                    self.seen[(str(func.overloadpacket), value.dtype)] += 1
        return func(*args, **kwargs)


def matmul_dtypes(recipe: Recipe) -> Counter[tuple[str, torch.dtype]]:
    """The matmul operands' dtypes over one whole training step of TINY under ``recipe`` (after a first step, so
    that the optimizer's state exists)."""
    trainer = Trainer(TINY, recipe, "cpu")
    first, second = batches(2)
    trainer.step(first)
    with MatmulDtypes() as seen:
        trainer.step(second)
    return seen.seen


def wrong_dtype(seen: Counter[tuple[str, torch.dtype]], dtype: torch.dtype) -> dict[str, int]:
    """The operands seen in another dtype than ``dtype``, as 'operator dtype': count."""
    return {f"{op} {dt}": n for (op, dt), n in sorted(seen.items(), key=str) if dt != dtype}


def operators(seen: Counter[tuple[str, torch.dtype]]) -> Counter[str]:
    """Operands per operator, whatever their dtype."""
    total: Counter[str] = Counter()
    for (op, _), n in seen.items():
        total[op] += n
    return total


@pytest.fixture(scope="module")
def fp32() -> dict[str, Counter[str]]:
    """The fp32 recipe's matmul operands by attention kernel: what a half-precision step must match, operator for
    operator (the same matmuls, none left out of the check)."""
    return {att: operators(matmul_dtypes(Recipe(attention=att))) for att in ("sdpa", "manual")}


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_fp32_runs_every_matmul_in_fp32(attention, fp32):
    seen = matmul_dtypes(Recipe(attention=attention))
    assert not wrong_dtype(seen, torch.float32)
    kernel = "aten.bmm" if attention == "manual" else "aten._scaled_dot_product_flash_attention_for_cpu"
    assert {"aten.mm", kernel} <= set(fp32[attention])  # the linear layers and the attention, seen by the mode


def check_autocast(precision: str, attention: str, fp32: dict[str, Counter[str]]) -> None:
    dtype = AUTOCAST[precision]
    seen = matmul_dtypes(Recipe(precision=precision, attention=attention))
    wrong = wrong_dtype(seen, dtype)
    assert not wrong, f"{precision} autocast: matmul operands not in {dtype}: {wrong}"
    assert operators(seen) == fp32[attention]  # every matmul of the fp32 step, each in the autocast dtype


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_bf16_autocast_runs_every_matmul_in_bf16(attention, fp32):
    check_autocast("bf16", attention, fp32)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_fp16_autocast_runs_every_matmul_in_fp16(attention, fp32):
    check_autocast("fp16", attention, fp32)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_bf16_pure_runs_every_matmul_in_bf16(attention, fp32):
    seen = matmul_dtypes(Recipe(precision="bf16-pure", attention=attention))
    assert not wrong_dtype(seen, torch.bfloat16)
    assert operators(seen) == fp32[attention]


def kept_dtypes(precision: str) -> tuple[list[torch.dtype], list[torch.dtype], list[torch.dtype]]:
    """The dtypes of the weights, of every gradient as it is accumulated, and of the optimizer's state (AdamW's
    two moments per weight) after two steps of TINY under ``precision``."""
    trainer = Trainer(TINY, Recipe(precision=precision), "cpu")
    grads: list[torch.dtype] = []
    for p in trainer.model.parameters():  # the step frees the gradients: read them as they are accumulated
        p.register_post_accumulate_grad_hook(lambda p: grads.append(p.grad.dtype))
    for batch in batches(2):
        trainer.step(batch)
    state = [v.dtype for s in trainer.optimizers[0].state.values() for v in s.values() if v.dim() > 0]
    return [p.dtype for p in trainer.model.parameters()], grads, state


@pytest.mark.parametrize(
    "precision,dtype", [("bf16-pure", torch.bfloat16), ("bf16", torch.float32), ("fp16", torch.float32)]
)
def test_bf16_pure_keeps_weights_gradients_and_optimizer_state_in_bf16_and_autocast_keeps_them_in_fp32(
    precision, dtype
):
    weights, grads, state = kept_dtypes(precision)
    assert set(weights) == {dtype}
    assert len(grads) == 2 * len(weights) and set(grads) == {dtype}  # one per weight and step
    assert len(state) == 2 * len(weights) and set(state) == {dtype}  # exp_avg and exp_avg_sq per weight


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_dropping_autocast_in_a_copy_of_the_trainer_fails_the_test_named_for_its_dtype(
    precision, tmp_path, monkeypatch
):
    monkeypatch.setattr(Trainer, "autocast", lambda self: contextlib.nullcontext())  # the plant, for this run
    name = f"test_{precision}_autocast_runs_every_matmul_in_{precision}"
    result = run_pytest(tmp_path, f"{HERE}::{name}", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=0, failed=2)  # both attention kernels
    result.stdout.fnmatch_lines(
        [f"*{precision} autocast: matmul operands not in {AUTOCAST[precision]}: *'aten.mm torch.float32': *"]
    )
