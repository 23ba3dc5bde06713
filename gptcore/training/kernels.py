"""The kernels past nanoGPT's (``Recipe.kernels``), from the optional ``gpu`` extra: liger-kernel's fused linear
cross-entropy and torchao's float8 training. Each package is imported only when a recipe asks for it, and
``kernels_unsupported`` says in one line why a recipe's kernels cannot run here: no CUDA GPU, one too old, or the
package missing (``pip install -e '.[gpu]'``; docs/gpu.md installs the wheels on a machine without a registry)."""

from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

from gptcore.config import Kernels

#: What each kernel needs: its package (the module, the pip requirement), and the compute capability.
LIGER = ("liger_kernel", "liger-kernel==0.8.5")
TORCHAO = ("torchao", "torchao==0.18.0")
FP8_CAPABILITY = (9, 0)


def below_capability(device: torch.device, capability: tuple[int, int]) -> str | None:
    """'NVIDIA A100-SXM4-80GB is 8.0' where CUDA ``device`` has a compute capability below ``capability``; None where
    it meets it. The one check of a kernel's GPU need: the pinned attention kernels' and FP8's."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= capability:
        return None
    return f"{torch.cuda.get_device_name(device)} is {major}.{minor}"


def _missing(package: tuple[str, str], what: str) -> str | None:
    module, requirement = package
    if importlib.util.find_spec(module) is None:
        return f"{what} needs {requirement} (pip install -e '.[gpu]'), which is not installed"
    return None


def kernels_unsupported(kernels: Kernels, device: torch.device | str) -> str | None:
    """Why ``kernels`` cannot run on ``device`` (their GPU, then their package), or None when they can."""
    device = torch.device(device)
    wanted = []
    if kernels.loss == "liger":
        wanted.append(("liger's fused linear cross-entropy", LIGER, None))
    if kernels.fp8:
        wanted.append(("FP8 training matmuls", TORCHAO, FP8_CAPABILITY))
    for what, package, capability in wanted:
        if device.type != "cuda":
            # a CPU can run both only slowly, as proofs of their arithmetic (tests/test_kernels.py), never to measure
            return f"{what}: kernels for a CUDA GPU; this run is on {device.type}"
        if capability and (short := below_capability(device, capability)):
            return f"{what} need compute capability >= {capability[0]}.{capability[1]} (Hopper or newer); {short}"
        reason = _missing(package, what)
        if reason:
            return reason
    return None


@torch.compiler.disable
def fused_linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor
) -> torch.Tensor:
    """The mean cross-entropy of ``h @ weight.T + bias`` against ``targets`` by liger-kernel's fused linear
    cross-entropy: chunk by chunk, with the gradients computed in the forward, so the logits never exist whole.
    Under autocast its operands are cast to the autocast dtype here (what autocast would do to the lm_head's
    matmul), and liger runs with autocast off.

    Never traced by ``torch.compile``: liger's kernels are Triton already, and its forward reads the token count on
    the host (``.item()``), so Dynamo would split it into graphs of its own, and under torch 2.11 it failed in
    them (``torch.addmm(..., out_dtype=torch.float32)``'s fake-tensor rule raised there; on a CPU, Triton's
    interpreter fails under Dynamo). A compiled model runs its blocks in one graph and this loss eagerly after it."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    device = h.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
    with torch.autocast(device, enabled=False):
        h, weight = h.reshape(-1, h.size(-1)).to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        # positional (apply takes no keywords): ce_weight, ignore_index, lse_square_scale, label_smoothing,
        # reduction, softcap, return_z_loss, then the gradients' accumulation dtype: fp32, as autocast's would be
        args = (None, -100, 0.0, 0.0, "mean", None, False, torch.float32)
        return LigerFusedLinearCrossEntropyFunction.apply(h, weight, targets.reshape(-1), bias, *args)[0]


def convert_to_fp8(blocks: nn.Module) -> None:
    """torchao's float8 training on every Linear of ``blocks`` (the transformer blocks, in place): dynamic
    tensorwise scales, the recipe torchao benchmarks first; the lm_head keeps the recipe's precision, as torchao
    and torchtitan advise for the output layer."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def fits(module: nn.Module, _: str) -> bool:  # FP8's matmuls need both dimensions divisible by 16
        return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0

    convert_to_float8_training(blocks, module_filter_fn=fits, config=Float8LinearConfig())
