"""A kernel's scratch: the bytes one op allocates through the CPU allocator and frees before it returns.

Half-precision matmuls on CPU run on oneDNN wherever it has kernels for them (``torch.ops.mkldnn.
_is_mkldnn_bf16_supported()``: AVX-512 CPUs), and oneDNN takes their scratch from c10's CPU allocator, whose count is
the CPU peak a case records (``allocator``). How much depends on the instruction set oneDNN picks. One
512 x 384 by 384 x 384 bf16 matmul, torch 2.13.0+cpu: 231,040 B with AVX512-BF16 (an Intel Xeon, family 6 model
207), 786,560 B with AVX-512 and no bf16 (the same CPU under ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``), 0 B where oneDNN
does not serve bf16 at all (AVX2: ATen's own kernels, as on an AMD EPYC family 25 model 1). So the CPU peak of a
half-precision case moves with the CPU by up to one kernel's scratch, and nothing else in it does.

``OpScratch`` measures it: around every op it sees, the allocator's peak inside the op above what was allocated
before and after it. ``kernel_scratch`` runs one eager step of a recipe under it: for a compiled recipe, the same
matmuls at the same shapes as its compiled step calls (inductor leaves them to ATen), whose scratch the dispatcher
cannot see inside compiled code.
"""

from __future__ import annotations

from dataclasses import replace

from torch.utils._python_dispatch import TorchDispatchMode

from gptcore.config import GPTConfig, Recipe
from gptcore.memory import allocator


class OpScratch(TorchDispatchMode):
    """The most bytes one op held inside itself (``most``) while active, counted by the CPU allocator: the peak
    during the op above the larger of the bytes allocated before and after it. Use inside ``allocator.counting()``;
    it resets the allocator's peak around each op, so nothing else may read that peak meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0
        self.op: str | None = None
        """The op that held ``most``."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = allocator.allocated_bytes()
        allocator.reset_peak()
        out = func(*args, **(kwargs or {}))
        held = allocator.max_allocated_bytes() - max(before, allocator.allocated_bytes())
        if held > self.most:
            self.most, self.op = held, str(func)
        return out


def kernel_scratch(cfg: GPTConfig, recipe: Recipe, steps: int = 1) -> int:
    """CPU: the most bytes one op held inside itself over ``steps`` steps of ``recipe`` run eagerly (compilation
    off: the same matmuls at the same shapes) on a fresh single-process Trainer of ``cfg``."""
    from gptcore.training.trainer import Trainer

    eager = replace(recipe, compile=False, compile_scope="model", memory_budget=None)
    trainer = Trainer(cfg, eager, "cpu")
    with allocator.counting(), OpScratch() as mode:
        for _ in range(steps):
            trainer.step()
    return mode.most
