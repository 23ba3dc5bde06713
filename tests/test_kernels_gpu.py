"""On a GPU (the smoke stage): the ladder's kernels past nanoGPT against a float64 reference on a tiny model, each
new kind reached once. These are the kernels the rungs run: liger's compiled Triton kernels and torchao's float8
matmuls on the tensor cores (tests/test_kernels.py proves the same arithmetic on CPU, liger under Triton's
interpreter). The reference is the same model's loss and gradients computed in float64 on the CPU (the
sliced-logits-free loss that tests/test_model.py proves on CPU). Skipped, with the reason, without CUDA or without the
package (``pip install -e '.[gpu]'``).

Tolerances from the arithmetic. bf16 has an 8-bit significand (unit roundoff 2^-8 = 3.9e-3): one bf16 matmul's
relative error grows as sqrt(K) x 2^-8 for K-term fp32-accumulated sums of rounded products, about 2% at K = 64;
through two blocks and the head a loss near ln(128) = 4.85 moves by well under 1%, so the loss is checked at 1e-2
relative and each gradient by the cosine of its angle to the reference (> 0.99) and its norm (within 5%). FP8 e4m3
has a 4-bit significand (2^-4 = 6.3% unit roundoff): 5x looser, 5e-2 on the loss, cosine > 0.95, norm within 20%.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gptcore.config import Kernels, Recipe
from gptcore.gate import plan
from gptcore.memory.fit import fit_batch
from gptcore.presets import RECIPES
from gptcore.training.kernels import kernels_unsupported
from gptcore.training.trainer import Trainer
from tests.helpers import TINY, batches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs CUDA (the compiled kernels; tests/test_kernels.py proves their arithmetic on CPU)",
    ),
]

# 128 wide and a padded vocabulary: FP8's matmuls need dimensions divisible by 16, the head takes the padding mask
SHAPE = dataclasses.replace(TINY, n_embd=128, n_head=4, batch_size=4)
BF16 = Recipe(precision="bf16", vocab_multiple=64, adamw_impl="fused")


def _skip_unless_runnable(recipe: Recipe) -> None:
    reason = kernels_unsupported(recipe.kernels, "cuda")
    if reason:
        pytest.skip(reason)


def _loss_and_grads(recipe: Recipe, device: str, dtype: torch.dtype) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward of the tiny model, seeded alike, on the same batch: the loss and every gradient."""
    trainer = Trainer(SHAPE, recipe, device, dtype=dtype)
    x, y = (t.to(device) for t in batches(1, SHAPE)[0])
    with trainer.autocast():
        loss = trainer.forward(x, y)[1]
    loss.backward()
    grads = {n: p.grad.detach().double().cpu() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def _reference() -> tuple[float, dict[str, torch.Tensor]]:
    return _loss_and_grads(dataclasses.replace(BF16, precision="fp32"), "cpu", torch.float64)


#: (the loss's relative tolerance, the least cosine of each gradient to its reference, its norm's relative tolerance)
BF16_BOUNDS = (1e-2, 0.99, 0.05)
FP8_BOUNDS = (5e-2, 0.95, 0.2)


def assert_near(
    got: tuple[float, dict], want: tuple[float, dict], loss_rtol: float, cosine: float, norm: float
) -> None:
    """``got``'s loss and gradients within the bounds of ``want``'s (the module's docstring derives them)."""
    assert got[0] == pytest.approx(want[0], rel=loss_rtol)
    for name, ref in want[1].items():
        g = got[1][name]
        cos = torch.nn.functional.cosine_similarity(g.flatten(), ref.flatten(), dim=0).item()
        assert cos > cosine, f"{name}: cosine {cos:.4f} to the float64 gradient"
        assert g.norm().item() == pytest.approx(ref.norm().item(), rel=norm), name


def test_liger_fused_loss_matches_float64():
    recipe = dataclasses.replace(BF16, kernels=Kernels(loss="liger"))
    _skip_unless_runnable(recipe)
    got = _loss_and_grads(recipe, "cuda", torch.float32)
    assert_near(got, _reference(), *BF16_BOUNDS)
    # and the unfused bf16 head, the rung below, on the same footing
    assert_near(_loss_and_grads(BF16, "cuda", torch.float32), _reference(), *BF16_BOUNDS)


def test_fp8_matmuls_match_float64():
    recipe = dataclasses.replace(BF16, kernels=Kernels(fp8=True))
    _skip_unless_runnable(recipe)
    got = _loss_and_grads(recipe, "cuda", torch.float32)
    assert_near(got, _reference(), *FP8_BOUNDS)


AUTOTUNED = dataclasses.replace(BF16, compile=True, compile_mode=RECIPES["ladder-10"].compile_mode)


@pytest.mark.planned(
    plan.SETUP_SECONDS["cuda"] + plan.compile_seconds(SHAPE, AUTOTUNED),
    why="one compile with autotuning, as the plan assumes a rung's",
)
def test_the_autotuned_compile_trains_like_eager():
    """The ladder's autotuned compile (ladder-10's mode, max-autotune-gemm): three steps' losses equal the
    eager step's within bf16's rounding (both bf16 autocast; only the kernels differ). Eager, not the default compile,
    is the reference: the same check for one compile fewer (the compile is nearly all of this test's time)."""
    losses = {}
    for name, recipe in (("eager", BF16), ("autotuned", AUTOTUNED)):
        trainer = Trainer(SHAPE, recipe, "cuda")  # seeded by its recipe: the same weights and batches
        losses[name] = [trainer.step().item() for _ in range(3)]
    assert losses["autotuned"] == pytest.approx(losses["eager"], rel=1e-2)


def _warm_library_workspaces() -> None:
    """Make the CUDA libraries allocate the workspaces they keep for the process's life: cuBLAS's (and cuBLASLt's),
    68-80 MB, is taken through the caching allocator at the first matmul on a stream and never given back, so it
    counts in ``memory_allocated()`` from then on. A bf16 and a float32 matmul, forward and backward, under autocast
    and not, through a Linear with a bias (addmm, cuBLASLt's epilogue) and without (mm), and one causal sdpa call
    forward and backward: each kind of call a training step of ``BF16`` makes. The tensors made here are freed on
    return; only what the libraries keep stays allocated."""
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    for dtype in (torch.float32, torch.bfloat16):
        linear = torch.nn.Linear(64, 64, device="cuda", dtype=dtype)
        (linear(x.to(dtype)) @ linear.weight).sum().backward()
    linear = torch.nn.Linear(64, 64, device="cuda")
    q = torch.randn(1, 2, 16, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # SHAPE's heads: 32 wide
    with torch.autocast("cuda", dtype=torch.bfloat16):  # the backward runs outside autocast, as a step's does
        out = linear(x).float().sum() + torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum()
    out.backward()
    torch.cuda.synchronize()


def test_the_fitted_batch_fits_the_device():
    """fit_memory on the real device: the fitted batch's step peaks within its budget (the estimate is the eager
    step's; measured peaks were within 0.5% of it, docs/memory.md), and one more sequence's estimate would not.
    The CUDA libraries' workspaces sit outside the estimate (docs/memory.md) and, on this 1% budget (~1.5 GB on an
    H200), are 5% of it: they are allocated before ``base`` is read (``_warm_library_workspaces``), as an earlier test
    of this module has allocated them when the module runs whole, so that run alone this test measures the same step
    (without the warm-up, its first matmul's workspace would count in the step's peak)."""
    recipe = dataclasses.replace(BF16, fit_memory=0.01)
    capacity = torch.cuda.get_device_properties(0).total_memory
    fit = fit_batch(SHAPE, recipe, "cuda", capacity)
    _warm_library_workspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    trainer = Trainer(dataclasses.replace(SHAPE, batch_size=fit.batch), recipe, "cuda")
    for _ in range(2):
        trainer.step()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    budget = fit.budget_bytes
    print(f"fitted batch {fit.batch}: estimated {fit.peak_bytes:,} B, measured {measured:,} B, budget {budget:,} B")
    assert measured <= budget * 1.01
