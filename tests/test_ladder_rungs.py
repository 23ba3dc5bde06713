"""The rungs past nanoGPT, on CPU: the batch that fills the device is the estimator's largest that fits; the kernels
that need a GPU or a package are refused in one line; the compile mode reaches torch.compile; the fused loss's
estimate drops the logits. Their arithmetic against a float64 reference runs on a GPU (tests/test_kernels_gpu.py,
in the smoke stage)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch

from gptcore.config import Kernels, Recipe
from gptcore.memory import estimate, resolve
from gptcore.memory.fit import device_memory, fit_batch, fitted
from gptcore.presets import LADDER, MODELS, RECIPES
from gptcore.training import kernels as kernels_module
from gptcore.training.kernels import kernels_unsupported
from gptcore.training.trainer import Trainer, UnsupportedRecipe
from tests.helpers import TINY, run_cli

pytestmark = pytest.mark.cpu

GPT2, TOP = MODELS["gpt2"], RECIPES["ladder-8"]
H200 = 150_121_545_728  # torch.cuda.get_device_properties(0).total_memory of an NVIDIA H200 (docs/gpu.md)


def _peak(cfg, recipe, batch, device="cuda") -> int:
    return estimate(resolve(cfg, recipe, batch=batch, seq=cfg.block_size, device=device)).total_bytes


@pytest.mark.parametrize("share", [0.5, 0.85])
@pytest.mark.parametrize("recipe", ["ladder-8", "ladder-9-liger"])
def test_the_fitted_batch_is_the_largest_whose_estimate_fits(recipe, share):
    recipe = dataclasses.replace(RECIPES[recipe], fit_memory=share)
    fit = fit_batch(GPT2, recipe, "cuda", H200)
    base = dataclasses.replace(recipe, fit_memory=None)
    assert fit.budget_bytes == int(share * H200)
    assert fit.peak_bytes == _peak(GPT2, base, fit.batch) <= fit.budget_bytes
    assert _peak(GPT2, base, fit.batch + recipe.grad_accum_steps) > fit.budget_bytes  # one more would not fit


def test_the_fitted_batch_respects_accumulation_and_the_cpu():
    cpu = dataclasses.replace(MODELS["cpu-small"])
    recipe = Recipe(grad_accum_steps=2, fit_memory=0.5)
    fit = fit_batch(cpu, recipe, "cpu", 100_000_000)
    assert fit.batch % 2 == 0
    base = dataclasses.replace(recipe, fit_memory=None)
    assert _peak(cpu, base, fit.batch, "cpu") <= 50_000_000 < _peak(cpu, base, fit.batch + 2, "cpu")
    assert fitted(cpu, recipe, "cpu", 100_000_000).batch_size == fit.batch
    assert fitted(cpu, dataclasses.replace(recipe, fit_memory=None), "cpu", 1) is cpu  # no fit asked: the model's


def test_the_rungs_past_nanogpt_fill_the_device_with_a_larger_batch_than_the_seeds():
    """ladder-9 is nanoGPT's step (ladder-8) at the batch that fills the device; every rung above keeps the fit."""
    assert [name for name in LADDER if RECIPES[name].fit_memory == 0.85] == [
        "ladder-9",
        "ladder-10",
    ]
    assert dataclasses.replace(RECIPES["ladder-9"], fit_memory=None) == TOP
    assert fitted(GPT2, RECIPES["ladder-9"], "cuda", H200).batch_size > 64  # the seed grew its batch by hand to 64


def test_the_fused_loss_fills_the_device_with_a_larger_batch():
    """What liger's fused loss saves (the B x T x vocab logits) becomes batch: its case beside the fitted rung holds
    more sequences in the same share of the device."""
    unfused, fused = (fitted(GPT2, RECIPES[name], "cuda", H200).batch_size for name in ("ladder-9", "ladder-9-liger"))
    assert fused > 2 * unfused  # the logits and their loss are about half of ladder-9's estimated peak


def test_a_share_of_1_fills_the_whole_device_and_more_is_refused():
    """fit_memory's range is (0, 1]: the whole device is a share that can be asked for, both of ``fit_batch`` and of
    ``estimate --fit``; over 1 or at 0 is refused in one line."""
    cpu, recipe = MODELS["cpu-small"], Recipe()
    whole = fit_batch(cpu, recipe, "cpu", 100_000_000, share=1.0)
    assert whole.budget_bytes == 100_000_000 and whole.batch > fit_batch(cpu, recipe, "cpu", 100_000_000, 0.5).batch
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="fit_memory: a share in"):
            fit_batch(cpu, recipe, "cpu", 100_000_000, share=bad)
    args = ("estimate", "--model", "cpu-small", "--recipe", "fp32", "--device", "cpu", "--capacity", "100000000")
    assert f"fit: batch {whole.batch} is the largest" in run_cli(*args, "--fit", "1").stdout
    [line] = run_cli(*args, "--fit", "1.5").stderr.strip().splitlines()
    assert "must be in (0, 1], got 1.5" in line


def test_the_cpu_fills_the_hosts_physical_memory_not_what_is_free(monkeypatch: pytest.MonkeyPatch):
    """On the CPU the batch fills the host's physical memory (page size x physical pages), not what is free at the
    moment: that moves with every other process, and would make the fitted batch a property of the moment."""
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1_000_000, "SC_AVPHYS_PAGES": 1_000}
    monkeypatch.setattr(os, "sysconf", pages.__getitem__)
    assert device_memory("cpu") == 4096 * 1_000_000


def test_a_smallest_batch_just_over_the_budget_does_not_fit():
    """The edge of fitting: a budget one byte under the smallest batch's estimated peak refuses it, naming both; at
    that peak, the smallest batch is the fit."""
    cpu, recipe = MODELS["cpu-small"], Recipe(grad_accum_steps=2, fit_memory=0.5)
    smallest = _peak(cpu, dataclasses.replace(recipe, fit_memory=None), 2, "cpu")  # one micro-batch of 1, twice
    with pytest.raises(ValueError, match=f"a batch of 2 already needs an estimated {smallest:,} B, over 0.5 of "):
        fit_batch(cpu, recipe, "cpu", 2 * (smallest - 1))
    assert fit_batch(cpu, recipe, "cpu", 2 * smallest).batch == 2


def test_a_batch_that_cannot_fit_is_one_line():
    done = run_cli(
        "estimate", "--model", "cpu-small", "--recipe", "fp32", "--device", "cpu", "--fit", "0.5", "--capacity", "9"
    )
    err = done.stderr.strip()
    assert done.returncode != 0 and len(err.splitlines()) == 1 and "a batch of 1 already needs" in err


def test_a_fit_for_a_gpu_on_a_machine_without_one_is_one_line_naming_capacity(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only machine, whatever this one is
    done = run_cli("estimate", "--model", "gpt2", "--recipe", "ladder-10")
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "sees no CUDA GPU here" in line and "--capacity" in line, done.stderr


def test_estimate_fit_prints_the_fitted_batch():
    done = run_cli("estimate", "--model", "gpt2", "--recipe", "ladder-10", "--capacity", str(H200))
    out = done.stdout
    batch = fitted(GPT2, RECIPES["ladder-10"], "cuda", H200).batch_size
    assert done.returncode == 0 and f"fit: batch {batch} is the largest" in out and f"batch {batch}, seq 1024" in out


def test_the_fused_loss_estimate_makes_no_logits_and_lowers_the_peak():
    plain = estimate(resolve(GPT2, TOP))
    fused = estimate(resolve(GPT2, dataclasses.replace(TOP, kernels=Kernels(loss="liger"))))
    logits = 2 * 16 * 1024 * TOP.vocab_rows(GPT2)  # the bf16 logits alone
    assert plain.at_forward_end["logits and loss"] > logits
    assert fused.at_forward_end["logits and loss"] < logits / 10  # its saved gradients: B x T x C and V x C
    assert fused.total_bytes < plain.total_bytes / 1.5
    assert fused.num_params == plain.num_params


@pytest.mark.parametrize(
    "kernels, start",
    [
        (Kernels(loss="liger"), "liger's fused linear cross-entropy: kernels for a CUDA GPU"),
        (Kernels(fp8=True), "FP8 training matmuls: kernels for a CUDA GPU"),
    ],
)
def test_gpu_kernels_are_refused_on_cpu_in_one_line(kernels, start):
    recipe = dataclasses.replace(TOP, compile=False, kernels=kernels)
    with pytest.raises(UnsupportedRecipe, match=f"^{start}; this run is on cpu$"):
        Trainer(TINY, dataclasses.replace(recipe, precision="bf16", num_workers=0, pin_memory=False), "cpu")
    with pytest.raises(ValueError, match="CUDA GPU"):
        resolve(TINY, recipe, device="cpu")


def test_a_missing_package_is_named_with_how_to_install_it(monkeypatch):
    """On a GPU that could run it, a recipe whose package is missing is skipped with the reason (the planted case: a
    Hopper GPU faked, find_spec answering None)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        kernels_module.importlib.util,
        "find_spec",
        lambda name: None if name in ("liger_kernel", "torchao") else real(name),
    )
    reason = kernels_unsupported(Kernels(loss="liger"), "cuda")
    install = "needs liger-kernel==0.8.5 (pip install -e '.[gpu]'), which is not installed"
    assert reason == f"liger's fused linear cross-entropy {install}"
    assert "torchao==0.18.0" in kernels_unsupported(Kernels(fp8=True), "cuda")


def test_fp8_is_refused_below_hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    reason = kernels_unsupported(Kernels(fp8=True), "cuda")
    assert (
        reason == "FP8 training matmuls need compute capability >= 9.0 (Hopper or newer); NVIDIA A100-SXM4-80GB is 8.0"
    )


@pytest.mark.parametrize(
    "rung, capability, skipped",
    [
        ("ladder-5", (7, 5), None),  # sdpa's own dispatch runs on any GPU
        ("ladder-8", (8, 0), None),
        ("ladder-9-liger-fp8", (8, 0), "needs compute capability >= 9.0"),  # FP8 over the rung's bf16
        ("ladder-9-liger-fp8", (9, 0), None),
    ],
)
def test_the_gpu_grid_skips_at_collection_what_the_gpu_cannot_run(monkeypatch, rung, capability, skipped):
    from bench.harness import needs_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    marks = needs_of(RECIPES[rung], "cuda")
    assert [m.kwargs["reason"] for m in marks] == ([skipped] if skipped else [])
    pinned = dataclasses.replace(RECIPES["ladder-8"], attention="flash")  # a pinned kernel: the model's own need
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert [m.kwargs["reason"] for m in needs_of(pinned, "cuda")] == ["needs compute capability >= 8.0"]


@pytest.mark.parametrize(
    "mode, passed",
    [
        ("default", {"mode": None}),
        ("max-autotune", {"mode": "max-autotune"}),
        ("max-autotune-gemm", {"options": {"max_autotune_gemm": True}}),  # no torch mode: inductor's option
        (
            "max-autotune-gemm-coordinate-descent",
            {"options": {"max_autotune_gemm": True, "coordinate_descent_tuning": True}},
        ),
    ],
)
def test_the_compile_mode_reaches_torch_compile(monkeypatch, mode, passed):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.append(kwargs) or model)
    Trainer(TINY, Recipe(compile=True, compile_mode=mode), "cpu")
    assert seen == [passed]


@pytest.mark.parametrize(
    "mode, marks",
    [("reduce-overhead", 4), ("max-autotune", 4), ("max-autotune-no-cudagraphs", 0), ("max-autotune-gemm", 0)],
)
def test_a_mode_with_cuda_graphs_begins_a_new_graph_iteration_before_every_micro_batch(monkeypatch, mode, marks):
    """CUDA graph trees reuse a replay's output memory at the next iteration: the step tells them where one begins,
    before each micro-batch's forward (2 steps of 2 micro-batches: 4), and only under a mode that captures graphs.
    The graphs themselves are CUDA's: tests/test_graphs_gpu.py holds their losses to eager's on a GPU."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: seen.append(1))
    trainer = Trainer(TINY, Recipe(compile=True, compile_mode=mode, grad_accum_steps=2), "cpu")
    for _ in range(2):
        trainer.step()
    assert len(seen) == marks


def test_a_compile_mode_without_compile_is_refused():
    with pytest.raises(ValueError, match="^compile_mode: a compile mode needs compile=True"):
        Recipe(compile_mode="max-autotune")
    with pytest.raises(ValueError, match="^fit_memory: must be a share in"):
        Recipe(fit_memory=1.5)
    with pytest.raises(ValueError, match="^kernels.loss: unknown 'cce'"):
        Kernels(loss="cce")
