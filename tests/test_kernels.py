"""On CPU: the ladder's kernels past nanoGPT compute what the rung below computes, on the same weights and batch.

A CPU can run both: liger-kernel's fused linear cross-entropy under Triton's interpreter (numpy executing the
kernels' own code), and torchao's float8 training eagerly (torch._scaled_mm has a CPU kernel). One difference from a
GPU: torchao's Float8Linear reads CUDA's autocast only, so on a CPU its input reaches the FP8 cast in fp32 rather
than bf16; FP8's rounding is 16 times bf16's, so the bounds below hold either way. One worker process
(tests/kernels_worker.py, ~18 s on 2 cores, 7 of them the compile checks) runs every recipe; the tests compare what
it saved. The compiled kernels themselves are proven on a GPU against float64 (tests/test_kernels_gpu.py, the smoke
stage).

Tolerances from the arithmetic:
- liger in fp32 against the unfused fp32 head: the same products, summed in another order (the log-sum-exp over the
  128 columns of the padded vocabulary block by block, the head's weight gradient chunk by chunk over the 64 rows).
  Reordering a sum of n float32 terms moves it by at most n x 2^-24 of the sum of their magnitudes: 128 x 6e-8 =
  7.6e-6. So the loss within 1e-5 relative, and each gradient within 2e-5 of its largest element, whose entries
  are sums of terms of like size (measured: bit-equal losses, gradients within 4.8e-7);
- liger and FP8 under bf16 autocast: tests/test_kernels_gpu.py's bounds (BF16_BOUNDS, FP8_BOUNDS). The interpreter
  rounds to bf16 by truncation where a GPU rounds to nearest, a bias of half a bf16 unit (2^-9 = 0.2%: measured 0.2%
  on every gradient's norm), inside the 5% bound.
The exact checks (which dtypes the matmuls see, how many FP8 matmuls run) are what a dropped cast or a dropped
conversion would change; the tolerances alone could not see either."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from gptcore.config import CHAR_VOCAB
from gptcore.plugin.options import under_xdist
from tests.test_kernels_gpu import BF16_BOUNDS, FP8_BOUNDS, SHAPE, assert_near

ROOT = Path(__file__).resolve().parents[1]


def _why_not() -> str | None:
    """Why this machine cannot run the proofs: a package missing, or a Triton whose interpreter fails under the
    installed numpy (Triton 3.6's makes a Python int of a 1-element array, which numpy 2.4 refuses; 3.7.0 fixed it).
    CI meets neither: constraints-cpu.txt pins the Triton. A CUDA torch brings its own Triton, which may be older."""
    missing = [m for m in ("liger_kernel", "torchao", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return f"needs {', '.join(missing)} (pip install -e '.[dev]', on Linux x86-64)"
    triton, numpy = (tuple(int(x) for x in version(m).split(".")[:2]) for m in ("triton", "numpy"))
    if triton < (3, 7) and numpy >= (2, 4):
        found = f"Triton {version('triton')}'s interpreter fails under numpy {version('numpy')}"
        return f"{found}: install Triton 3.7 or newer, or numpy below 2.4"
    return None


WHY_NOT = _why_not()
pytestmark = [pytest.mark.cpu, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]
WORKER_TIMEOUT_S = 300
#: FP8 matmuls in one step: each of a block's 4 Linear layers (c_attn, attn.c_proj, c_fc, mlp.c_proj) runs its
#: forward, its input gradient and its weight gradient in FP8; the lm_head stays in the recipe's precision.
FP8_MATMULS = 3 * 4 * SHAPE.n_layer


@pytest.fixture(scope="session")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every recipe's loss, gradients, matmul dtypes and FP8 matmul count (tests/kernels_worker.py), by name: one
    worker run for the whole test run. Under xdist the workers share the run's temporary folder, and the first to
    ask runs it while the other waits on the lock (a module's fixture ran 3 times in one `-n 2` run: work-stealing
    hands a worker other modules' tests between two of this one's)."""
    shared = tmp_path_factory.getbasetemp()
    if under_xdist():
        shared = shared.parent  # this run's folder, above each worker's own
    out = shared / "kernels"
    with open(shared / "kernels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "kernels.pt").exists():
            out.mkdir(exist_ok=True)
            env = dict(os.environ, TRITON_INTERPRET="1")  # the worker puts the checkout on its path itself
            cmd = [sys.executable, str(ROOT / "tests" / "kernels_worker.py"), str(out)]
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
            assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out / "kernels.pt")


def _pair(result: dict) -> tuple[float, dict[str, torch.Tensor]]:
    return result["loss"], {n: g.double() for n, g in result["grads"].items()}


def assert_same_fp32(got: dict, want: dict) -> None:
    """Within float32's reordering bound (the module's docstring): the loss to 1e-5 relative, each gradient to 2e-5
    of its largest element."""
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=0)
    assert got["grads"].keys() == want["grads"].keys()
    for name, ref in want["grads"].items():
        worst = (got["grads"][name] - ref).abs().max().item()
        assert worst <= 2e-5 * ref.abs().max().item(), f"{name}: {worst:.3g} from the unfused head's gradient"


def test_liger_fused_loss_equals_the_unfused_head_in_fp32(results):
    assert_same_fp32(results["fp32-liger"], results["fp32"])


def test_liger_fused_loss_matches_the_unfused_head_under_bf16(results):
    assert_near(_pair(results["bf16-liger"]), _pair(results["bf16"]), *BF16_BOUNDS)


def test_liger_runs_the_head_in_bf16_under_bf16_autocast(results):
    """The head's matmuls inside liger see bf16 operands, as autocast gives the unfused head's: no float32 matmul
    anywhere in the step (a dropped cast would run liger's in float32 and still pass the tolerance above)."""
    dtypes = {key.split()[1] for key in results["bf16-liger"]["matmuls"]}
    assert dtypes == {"torch.bfloat16"}, results["bf16-liger"]["matmuls"]


def test_the_comparison_catches_a_fused_loss_without_the_padding_mask(results):
    """Planted in the worker: liger's loss over the 51 padding columns as well (its bias dropped). The fp32 check
    above fails on it (the loss moved 11%)."""
    assert SHAPE.vocab_size == CHAR_VOCAB and CHAR_VOCAB % 64  # the proofs' vocabulary is padded, as the rungs'
    with pytest.raises(AssertionError):
        assert_same_fp32(results["fp32-liger-unmasked"], results["fp32"])


def test_under_torch_compile_liger_runs_outside_the_graph_and_computes_the_same_loss(results):
    """A compiled model captures the blocks in one graph and leaves liger's loss out of it (its kernels are Triton
    already, and Dynamo inside its forward failed on an H200 under torch 2.11): no captured node comes from
    liger-kernel's code (the worker's backend raises at the first), and the loss is the eager one to the bit (the
    same operations, run as captured)."""
    compiled = results["fp32-liger-compiled"]
    assert "error" not in compiled, compiled.get("error")
    assert compiled["graphs"] == 1
    assert compiled["loss"] == compiled["eager_loss"]


def test_the_compile_check_catches_liger_traced_by_dynamo(results):
    """Planted in the worker: liger's loss without ``torch.compiler.disable``. Dynamo then captures liger's first
    lines (the token count, up to its ``.item()``) in the model's graph, and the check above fails on it."""
    traced = results["fp32-liger-compiled-traced"]
    assert "nodes of liger-kernel's code in a captured graph" in traced.get("error", ""), traced


def test_fp8_matmuls_match_the_bf16_rung(results):
    assert_near(_pair(results["bf16-fp8"]), _pair(results["bf16"]), *FP8_BOUNDS)


def test_fp8_runs_every_block_matmul_in_fp8_and_the_head_in_bf16(results):
    """Exactly 3 FP8 matmuls per Linear of every block, and none in the bf16 rung below; the head's and attention's
    matmuls stay bf16 (an lm_head converted too would add 3 FP8 matmuls)."""
    assert results["bf16-fp8"]["scaled_mm"] == FP8_MATMULS
    assert results["bf16"]["scaled_mm"] == 0
    attention = {k for k in results["bf16-fp8"]["matmuls"] if "scaled_dot_product" in k}
    assert attention and all(k.endswith("torch.bfloat16") for k in attention)


def test_fp8_converts_only_the_linear_layers_whose_dimensions_are_multiples_of_16(results):
    """An FP8 matmul (torch._scaled_mm) needs both dimensions of its weight divisible by 16: a layer with one that is
    not keeps the recipe's precision rather than fail the step (GPT-2's are all multiples of 16: 768, 2304, 3072)."""
    assert results["fp8-converted"] == ["Float8Linear", "Linear", "Linear", "Float8Linear"]
