"""The model's arithmetic pinned to a committed float64 reference, outside the code under test.

The other CPU proofs compare recipes with each other, so a change to the shared math (an activation, a scale, a
normalization, a train/eval switch) moves both sides and passes. These tests compare with figures computed once
and committed (``tests/data/reference_float64.json``, made by ``python -m tests.reference --write``).

Regenerating the fixture is legitimate only when the model's math is meant to change (a new architecture choice,
a fixed bug in the arithmetic), and the commit must say so. Never regenerate it to make a refactor pass: a
refactor that should change no number and fails here has changed the math.

Tolerance: float64 throughout. Different BLAS kernels, thread counts or instruction sets reorder the sums of a
few hundred terms, which moves a result by ~1e-16 relative per operation; through two blocks, the loss and five
AdamW steps this stays below 1e-14. 1e-12 is a hundredfold margin and far below any change of the math (swapping
the GELU approximation moves the logits by ~1e-4).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from tests.reference import FIXTURE, compute

pytestmark = pytest.mark.cpu

TOL = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def actual() -> dict:
    return compute()


def test_logits_equal_the_reference(actual, expected):
    assert_close(
        torch.tensor(actual["logits"], dtype=torch.float64),
        torch.tensor(expected["logits"], dtype=torch.float64),
        **TOL,
    )


def test_loss_and_gradient_norms_equal_the_reference(actual, expected):
    assert actual["loss"] == pytest.approx(expected["loss"], rel=1e-12, abs=1e-12)
    assert actual["grad_norms"].keys() == expected["grad_norms"].keys()
    for name, norm in expected["grad_norms"].items():
        assert actual["grad_norms"][name] == pytest.approx(norm, rel=1e-12, abs=1e-12), name


def test_five_training_steps_equal_the_reference(actual, expected):
    # the default recipe: AdamW with weight decay, warmup + cosine schedule and clipping at 1.0
    assert actual["train_losses"] == pytest.approx(expected["train_losses"], rel=1e-12, abs=1e-12)
    assert actual["param_norm_after"] == pytest.approx(expected["param_norm_after"], rel=1e-12, abs=1e-12)


def test_manual_attention_computes_the_same_reference(expected):
    # the masked-softmax kernel and SDPA are two implementations of one formula
    manual = compute(attention="manual")
    assert_close(
        torch.tensor(manual["logits"], dtype=torch.float64),
        torch.tensor(expected["logits"], dtype=torch.float64),
        **TOL,
    )
    assert manual["train_losses"] == pytest.approx(expected["train_losses"], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("change", ["tanh GELU", "LayerNorm eps 1e-6"])
def test_a_small_change_of_the_math_is_caught(change, expected, monkeypatch):
    # planted here, on a patched copy of the model's building blocks, never in gptcore: the reference must see it
    import gptcore.training.model as model_module

    if change == "tanh GELU":
        gelu = torch.nn.GELU
        monkeypatch.setattr(model_module.nn, "GELU", lambda: gelu(approximate="tanh"))
    else:
        layer_norm = torch.nn.LayerNorm
        monkeypatch.setattr(model_module.nn, "LayerNorm", lambda *a, **k: layer_norm(*a, eps=1e-6, **k))
    changed = torch.tensor(compute()["logits"], dtype=torch.float64)
    gap = (changed - torch.tensor(expected["logits"], dtype=torch.float64)).abs().max().item()
    assert gap > 1e3 * TOL["atol"], f"{change} moved the logits by only {gap:.1e}"
