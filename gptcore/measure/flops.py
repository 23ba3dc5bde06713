"""The FLOP formulas the suite owns: one per operator the model dispatches on CPU and on CUDA (the matmuls and every
scaled-dot-product-attention kernel, forward and backward), so that the work ledger's FLOPs belong to the
computation and not to the torch version that counts them.

torch's ``FlopCounterMode`` registry grows from release to release: torch 2.13 has no formula for CPU flash
attention, 2.15 has one, and a ledger built on the registry moved by 9.6% on an upgrade that changed nothing. Here
every attention kernel counts what the math path (``q @ kᵀ``, softmax, ``@ v``) dispatches as bmms, whichever kernel
ran: forward 2 matmuls, backward 4 (the gradients of the scores, V, Q and K). That is the analytic count of
``GPT.flops_per_token``: 6 x the matmul weights plus 12 x layers x width x T per token, the full T x T as torch
counts it. torch's formulas for the fused backwards also count their recomputation of the scores (one more
``q @ kᵀ``); the suite leaves that out, as PaLM's MFU does, so that flash and math count alike.
``tests/test_flops.py`` holds every formula to torch's registry wherever torch has one, and the attention kernels to
the math path counted by torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Formula = Callable[..., int]


def _mm(a: Any, b: Any, *_: Any, **__: Any) -> int:
    (m, k), (_k, n) = a.shape, b.shape
    return 2 * m * n * k


def _addmm(_self: Any, a: Any, b: Any, *_: Any, **__: Any) -> int:
    return _mm(a, b)


def _bmm(a: Any, b: Any, *_: Any, **__: Any) -> int:
    (batch, m, k), (_b, _k, n) = a.shape, b.shape
    return 2 * batch * m * n * k


def _baddbmm(_self: Any, a: Any, b: Any, *_: Any, **__: Any) -> int:
    return _bmm(a, b)


def attention_forward(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    """Scores ``q @ kᵀ`` and their product with V: q (batch, heads, s_q, d), k (batch, kv heads, s_k, d),
    v (batch, kv heads, s_k, d_v); grouped K/V heads are broadcast to the query's heads, as the kernels do."""
    (b, h, s_q, d), s_k, d_v = q, k[2], v[3]
    return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v


def attention_backward(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    """The gradients of the scores (dO @ vᵀ), of V (Pᵀ @ dO), of Q (dS @ k) and of K (dSᵀ @ q): twice the forward."""
    return 2 * attention_forward(q, k, v)


def _sdpa(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
    return attention_forward(tuple(query.shape), tuple(key.shape), tuple(value.shape))


def _sdpa_backward(_grad_out: Any, query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
    return attention_backward(tuple(query.shape), tuple(key.shape), tuple(value.shape))


FORMULAS: dict[str, Formula] = {
    "aten.mm": _mm,
    "aten.addmm": _addmm,
    "aten.bmm": _bmm,
    "aten.baddbmm": _baddbmm,
    # the fused attention kernels (the math path dispatches bmms, counted above)
    "aten._scaled_dot_product_flash_attention": _sdpa,
    "aten._scaled_dot_product_flash_attention_for_cpu": _sdpa,
    "aten._scaled_dot_product_efficient_attention": _sdpa,
    "aten._scaled_dot_product_cudnn_attention": _sdpa,
    "aten._scaled_dot_product_flash_attention_backward": _sdpa_backward,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
    "aten._scaled_dot_product_efficient_attention_backward": _sdpa_backward,
    "aten._scaled_dot_product_cudnn_attention_backward": _sdpa_backward,
}
"""Operator (its overload packet's name, ``str(func.overloadpacket)``) -> FLOPs of one call, from the call's
arguments. An operator not here counts no FLOPs (its FLOPs, where torch has a formula, are kept apart as
uncounted: :func:`uncounted`)."""


def count(packet: str, args: tuple, kwargs: dict) -> int | None:
    """FLOPs of one call of the operator ``packet`` with ``args``/``kwargs``; None when the table has no formula."""
    formula = FORMULAS.get(packet)
    return None if formula is None else int(formula(*args, **kwargs))


def uncounted(func: Any, args: tuple, kwargs: dict, out: Any) -> int | None:
    """FLOPs torch's own registry gives a call the table has no formula for (None where torch has none either).
    Kept beside the ledger, never in its FLOPs: when torch starts or stops counting an operator, the ledger names
    the operator and says the counter changed, not the work."""
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func.overloadpacket)
    if formula is None:
        return None
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula torch cannot apply to these arguments counts nothing
        return None
