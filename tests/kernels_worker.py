"""The CPU side of tests/test_kernels.py, in a process of its own: ``TRITON_INTERPRET=1 python tests/kernels_worker.py
OUT`` writes OUT/kernels.pt, one forward and backward of the tiny model per recipe: its loss, every gradient, the
dtypes of every matmul's operands as the dispatcher saw them, and how many ``aten::_scaled_mm`` the profiler saw
(torchao's float8 tensors run it inside their own dispatch, below what a dispatch mode sees); and liger's loss under
``torch.compile``: what Dynamo captured.

Its own process because Triton chooses between compiling a kernel and interpreting it when the kernel's module is
imported: liger-kernel imported here runs under Triton's interpreter (numpy executing the kernels' own code, on CPU
tensors), and no test process ever holds an interpreted liger beside a compiled one (tests/test_kernels_gpu.py).
torchao's float8 training needs no interpreter: torch._scaled_mm has a CPU kernel. The recipes refuse both kernels on
a CPU, which has neither the speed nor the tensor cores they are for; this worker lifts that refusal, as the proofs
need the arithmetic only."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gptcore.training.kernels as kernels_module
import gptcore.training.model as model_module
import gptcore.training.trainer as trainer_module
from gptcore.config import Kernels, Recipe
from tests.helpers import batches
from tests.test_kernels_gpu import BF16, SHAPE
from tests.test_precision import MatmulDtypes

FP32 = dataclasses.replace(BF16, precision="fp32")
LIGER = Kernels(loss="liger")
RECIPES = {
    "fp32": FP32,
    "fp32-liger": dataclasses.replace(FP32, kernels=LIGER),
    "bf16": BF16,
    "bf16-liger": dataclasses.replace(BF16, kernels=LIGER),
    "bf16-fp8": dataclasses.replace(BF16, kernels=Kernels(fp8=True)),
}


def step(recipe: Recipe) -> dict:
    """One forward and backward of SHAPE under ``recipe`` on the CPU, seeded as every other: the loss, the
    gradients, the matmuls' operand dtypes, and the count of FP8 matmuls (``aten::_scaled_mm``, whose operands can
    only be float8)."""
    trainer = trainer_module.Trainer(SHAPE, recipe, "cpu")
    x, y = batches(1, SHAPE)[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, MatmulDtypes() as seen:
        with trainer.autocast():
            loss = trainer.forward(x, y)[1]
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    scaled_mm = sum(1 for e in prof.events() if e.name == "aten::_scaled_mm")
    matmuls = {f"{op} {dtype}": n for (op, dtype), n in seen.seen.items()}
    return {"loss": loss.item(), "grads": grads, "matmuls": matmuls, "scaled_mm": scaled_mm}


def compiled_forward(recipe: Recipe) -> dict:
    """One forward of SHAPE under ``recipe`` with the model under ``torch.compile``, each graph kept as Dynamo
    captured it (a backend that runs it as captured: no inductor, so it costs seconds): the loss, the eager loss and
    the number of graphs; or the error, where the backend found a node of liger-kernel's code in a graph (it stops
    the compile there) or Dynamo failed."""
    trainer = trainer_module.Trainer(SHAPE, recipe, "cpu")
    x, y = batches(1, SHAPE)[0]
    graphs = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        liger = sum("liger_kernel" in (node.stack_trace or "") for node in gm.graph.nodes)
        if liger:
            raise RuntimeError(f"{liger} nodes of liger-kernel's code in a captured graph")
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        loss = torch.compile(trainer.model, backend=record)(x, y)[1].item()
    except Exception as e:  # the failure is the result: a planted regression raises here (the tests say which)
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"loss": loss, "eager_loss": trainer.model(x, y)[1].item(), "graphs": len(graphs)}


def fp8_converted() -> list[str]:
    """The classes of four Linear layers after ``convert_to_fp8``: the first and last have both dimensions multiples
    of 16, the two between have one that is not (24)."""
    layers = torch.nn.Sequential(*(torch.nn.Linear(i, o) for i, o in ((32, 48), (48, 24), (24, 32), (32, 32))))
    kernels_module.convert_to_fp8(layers)
    return [type(layer).__name__ for layer in layers]


def main(out: Path) -> None:
    trainer_module.kernels_unsupported = lambda kernels, device: None  # the CPU's refusal lifted (docstring)
    results = {name: step(recipe) for name, recipe in RECIPES.items()}
    # planted, for the test that proves the comparison catches it: liger's loss without the padding columns' -inf
    fused = model_module.fused_linear_cross_entropy
    model_module.fused_linear_cross_entropy = lambda h, weight, bias, targets: fused(h, weight, None, targets)
    results["fp32-liger-unmasked"] = step(RECIPES["fp32-liger"])
    model_module.fused_linear_cross_entropy = fused
    results["fp32-liger-compiled"] = compiled_forward(RECIPES["fp32-liger"])
    # planted: liger's loss without torch.compiler.disable, so that Dynamo traces into liger's forward (on an H200,
    # torch 2.11 failed there: the liger and FP8 rungs never ran)
    model_module.fused_linear_cross_entropy = fused.__wrapped__
    results["fp32-liger-compiled-traced"] = compiled_forward(RECIPES["fp32-liger"])
    results["fp8-converted"] = fp8_converted()
    torch.save(results, out / "kernels.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
