"""Tests for gptcore.memory: the analytic estimate and the fake-tensor simulation against real tracked runs."""
from __future__ import annotations

import dataclasses
import functools
import time

import pytest
import torch

from gptcore import GPT, MODELS, Recipe, Trainer, get_model, get_recipe
from gptcore.__main__ import main
from gptcore.config import GPTConfig
from gptcore.memory import GiB, estimate, fold, param_shapes, simulate
from gptcore.memtrack import track_training

pytestmark = pytest.mark.cpu

CPU_SMALL = get_model("cpu-small")
# the recipes the issue names: plain AdamW, checkpointing, gradient accumulation, optimizer in backward, SGD
ISSUE_RECIPES = ("fp32", "checkpoint", "grad-accum", "fused-optim", "sgd-cosine")
_simulate_cpu = functools.lru_cache(functools.partial(simulate, device="cpu", method="direct"))  # shared by tests


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """cpu-small's tensors are tiny: intra-op threads only fight the other xdist worker for the 2 cores (a real
    tracked run takes 0.1 s alone and several seconds when they do)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("variant", [dict(), dict(tie_weights=False, vocab_multiple=64)],
                         ids=["tied-unpadded", "untied-padded-to-64"])
@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_list_matches_the_model(name, variant):
    """Every parameter (name, numel, decayed or not) in GPT.parameters() order, so that the optimizer's groups and
    the for-loop step's order are right too; built on the meta device (no memory, no init cost)."""
    recipe = Recipe(**variant)
    for cfg in (MODELS[name], dataclasses.replace(MODELS[name], bias=False)):
        with torch.device("meta"):
            model = GPT(cfg, recipe)
        assert param_shapes(cfg, recipe) == [(n, p.numel(), p.dim() >= 2) for n, p in model.named_parameters()]
        assert estimate(cfg, recipe).num_params == model.num_params()


@pytest.mark.parametrize("recipe", ISSUE_RECIPES)
def test_simulation_equals_a_real_tracked_run_on_cpu(recipe):
    """Same bytes, same phase and step, same breakdown (folded into memtrack's categories): the fake run is the
    real Trainer's code path, only without data."""
    real = track_training(Trainer(CPU_SMALL, get_recipe(recipe), "cpu"))
    sim = _simulate_cpu(CPU_SMALL, get_recipe(recipe))
    assert (sim.peak_bytes, sim.phase, sim.step) == (real.peak_bytes, real.phase, real.step)
    assert fold(sim.by_category) == real.by_category
    assert sum(sim.by_category.values()) == sim.peak_bytes


@pytest.mark.parametrize("recipe", ISSUE_RECIPES)
def test_analytic_total_within_10_percent_of_simulation(recipe):
    est = estimate(CPU_SMALL, get_recipe(recipe), device="cpu")
    sim = _simulate_cpu(CPU_SMALL, get_recipe(recipe))
    assert est.total_bytes == pytest.approx(sim.peak_bytes, rel=0.10)
    assert est.phase == sim.phase
    assert sum(est.by_category.values()) == est.total_bytes


DROPOUT_B1 = dict(dropout=0.1, batch_size=1)  # dropout masks; CPU sdpa's math fallback; bmm without copies
VARIANTS = {
    "bf16": (dict(), dict(precision="bf16")),
    "bf16-pure": (dict(), dict(precision="bf16-pure")),
    "bf16-checkpoint-dropout-b1": (DROPOUT_B1, dict(precision="bf16", checkpoint=True)),
    "manual": (dict(), dict(attention="manual")),
    "manual-dropout-b1": (DROPOUT_B1, dict(attention="manual")),
    "math-bf16": (dict(), dict(attention="math", precision="bf16")),
    "padded-untied-bf16": (dict(), dict(vocab_multiple=64, tie_weights=False, precision="bf16")),
    "for-loop": (dict(), dict(adamw_impl="for-loop")),
    "fused-adamw-small-batch": (dict(batch_size=1, block_size=8), dict(adamw_impl="fused")),
    "bf16-oib-dropout-b1": (DROPOUT_B1, dict(precision="bf16", optim_in_backward=True, grad_clip=None)),
}


@pytest.mark.parametrize("shape, change", VARIANTS.values(), ids=VARIANTS.keys())
def test_analytic_follows_the_code_within_1_percent(shape, change):
    """The ledger replays model.py and train.py op by op, so on the CPU it lands within a few hundred bytes of the
    simulation (1% leaves room for the order of frees inside one autograd node); a change to the model's ops
    that the ledger does not follow shows up here."""
    cfg, recipe = dataclasses.replace(CPU_SMALL, **shape), Recipe(**change)
    est = estimate(cfg, recipe, device="cpu")
    sim = simulate(cfg, recipe, device="cpu", method="direct")
    assert est.total_bytes == pytest.approx(sim.peak_bytes, rel=0.01)
    assert est.phase == sim.phase


def test_checkpointing_lowers_activations():
    plain, ckpt = get_recipe("fp32"), get_recipe("checkpoint")
    a, b = estimate(CPU_SMALL, plain, device="cpu"), estimate(CPU_SMALL, ckpt, device="cpu")
    # saved by the forward: every block's activations (16 B*T*C fp32 tensors each) vs every block's input alone
    btc4 = CPU_SMALL.batch_size * CPU_SMALL.block_size * CPU_SMALL.n_embd * 4
    assert a.at_forward_end["activations"] > 16 * CPU_SMALL.n_layer * btc4
    assert b.at_forward_end["activations"] < 2 * (CPU_SMALL.n_layer + 1) * btc4
    assert b.by_category["activations"] < a.by_category["activations"] / 2
    sa, sb = _simulate_cpu(CPU_SMALL, plain), _simulate_cpu(CPU_SMALL, ckpt)
    assert sb.by_category["activations"] < sa.by_category["activations"] / 2
    assert sb.peak_bytes < sa.peak_bytes


def test_mixed_precision_adam_holds_16_bytes_per_parameter():
    """bf16 autocast + AdamW: fp32 weights (4, autocast's master weights are the parameters themselves) + fp32
    gradients (4) + two fp32 moments (8) = 16 bytes/parameter; autocast adds bf16 copies (2 bytes) of every matmul
    weight, cached from forward until each layer's backward."""
    cfg, recipe = get_model("gpt2-xl"), get_recipe("bf16")
    est = estimate(cfg, recipe, batch=32, seq=1024)
    n = est.num_params
    assert est.bytes_per_param == 16
    assert est.states == {"parameters": 4 * n, "gradients": 4 * n, "optimizer state": 8 * n,
                          "weight copies": pytest.approx(2 * n, rel=0.02)}  # LayerNorms and wpe are not copied
    # the whole 16 bytes are live at once in the optimizer step: seen there with a batch too small to matter
    small = dataclasses.replace(CPU_SMALL, batch_size=1, block_size=8)
    n_small = sum(k for _, k, _ in param_shapes(small, recipe))
    for result in (simulate(small, recipe, device="cpu", method="direct"), estimate(small, recipe, device="cpu")):
        assert result.phase == "optimizer"
        by = result.by_category
        assert (by["parameters"], by["gradients"], by["optimizer state"]) == (4 * n_small, 4 * n_small, 8 * n_small)


def test_optimizer_in_backward_saves_little_unless_activations_are_small():
    """Seed 002's puzzle. The gradients of a normal backward pile up towards its END, when the activations are
    already freed, while the peak sits at its START (activations + cross-entropy buffers, no gradients yet):
    freeing each gradient right after its step removes memory that was never part of the peak. With
    checkpointing the activations shrink and the peak moves to where the gradients are."""
    cfg = get_model("gpt2-xl")
    plain, oib = (estimate(cfg, get_recipe(r), batch=32) for r in ("fp32", "fused-optim"))
    assert oib.total_bytes > 0.99 * plain.total_bytes
    assert plain.phase == "backward" and plain.by_category.get("gradients", 0) < 0.01 * plain.total_bytes
    assert plain.at_backward_end["gradients"] == pytest.approx(plain.states["gradients"], rel=1e-4)  # 512-B blocks
    small = dataclasses.replace(CPU_SMALL, batch_size=2)
    assert estimate(small, get_recipe("fused-checkpoint")).total_bytes < 0.9 * estimate(
        small, get_recipe("checkpoint")).total_bytes


@pytest.mark.parametrize("recipe", ["checkpoint", "grad-accum", "fused-optim", "bf16"])
def test_extrapolation_from_2_and_3_layers_is_exact(recipe):
    cfg = dataclasses.replace(CPU_SMALL, n_layer=5)
    direct = simulate(cfg, get_recipe(recipe), device="cpu", method="direct")
    ext = simulate(cfg, get_recipe(recipe), device="cpu", method="extrapolate")
    assert ext.method == "extrapolated from 2 and 3 layers"
    assert (ext.peak_bytes, ext.phase, ext.step, ext.by_category) == (
        direct.peak_bytes, direct.phase, direct.step, direct.by_category)


def test_extrapolation_follows_the_peak_into_another_phase():
    """A small batch and a large vocabulary: with few layers the cross-entropy buffers make backward the peak, with
    many the optimizer step wins. Extending the 2- and 3-layer peaks along one line would miss it; extending every
    segment's peak does not."""
    def cfg(n: int) -> GPTConfig:
        return GPTConfig(n_layer=n, n_head=4, n_embd=128, block_size=8, vocab_size=8192, batch_size=1,
                         dataset="random")
    two, three = (simulate(cfg(n), Recipe(), device="cpu", method="direct") for n in (2, 3))
    assert two.phase == three.phase == "backward"
    direct = simulate(cfg(8), Recipe(), device="cpu", method="direct")
    ext = simulate(cfg(8), Recipe(), device="cpu", method="extrapolate")
    assert direct.phase == "optimizer"
    assert (ext.peak_bytes, ext.phase, ext.by_category) == (direct.peak_bytes, direct.phase, direct.by_category)
    assert ext.peak_bytes > two.peak_bytes + 6 * (three.peak_bytes - two.peak_bytes)


def test_cuda_rounding_and_simulation_agree_with_the_estimate_for_gpt2_xl():
    """The seed-003 question; fast because the simulation extrapolates (< 10 s on 2 cores is the budget)."""
    cfg, recipe = get_model("gpt2-xl"), get_recipe("bf16")
    for rec in (recipe, dataclasses.replace(recipe, checkpoint=True)):
        start = time.perf_counter()
        sim = simulate(cfg, rec, batch=32, seq=1024)
        assert time.perf_counter() - start < 10
        est = estimate(cfg, rec, batch=32, seq=1024)
        assert sim.method.startswith("extrapolated")
        assert sim.peak_bytes % 512 == 0
        assert est.total_bytes == pytest.approx(sim.peak_bytes, rel=0.01)
        assert est.phase == sim.phase == "backward"


def test_estimate_is_arithmetic():
    start = time.perf_counter()
    est = estimate(get_model("gpt2-xl"), get_recipe("bf16"), batch=32, seq=1024)
    assert time.perf_counter() - start < 1.0
    assert 100 * GiB < est.total_bytes < 150 * GiB


def test_compile_and_cuda_only_switches_are_mapped_with_a_note_or_refused():
    cfg = get_model("gpt2")
    est = estimate(cfg, get_recipe("ladder-5"))  # tf32, compile, flash
    assert any("compile" in n for n in est.notes) and any("flash" in n for n in est.notes)
    assert est.total_bytes == estimate(cfg, dataclasses.replace(
        get_recipe("ladder-5"), compile=False, attention="sdpa", precision="bf16")).total_bytes
    with pytest.raises(ValueError, match="flash"):
        estimate(CPU_SMALL, get_recipe("ladder-5"), device="cpu")
    with pytest.raises(ValueError, match="tf32"):
        simulate(CPU_SMALL, get_recipe("tf32"), device="cpu")


@pytest.mark.parametrize("kwargs, match", [
    (dict(device="tpu"), "device"), (dict(batch=0), "batch"), (dict(seq=-8), "seq"), (dict(batch=10), "divide")])
def test_bad_input_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate(CPU_SMALL, get_recipe("grad-accum"), **kwargs)


def test_seq_longer_than_the_preset_replaces_block_size():
    longer = estimate(CPU_SMALL, get_recipe("fp32"), seq=128, device="cpu")
    base = estimate(CPU_SMALL, get_recipe("fp32"), device="cpu")
    assert longer.num_params == base.num_params + 64 * CPU_SMALL.n_embd  # the position table grows
    assert longer.at_forward_end["activations"] > 1.9 * base.at_forward_end["activations"]


def test_cli_prints_the_breakdown_and_refuses_bad_input_in_one_line(capsys):
    assert main(["estimate", "--model", "cpu-small", "--recipe", "checkpoint", "--device", "cpu", "--simulate"]) == 0
    out = capsys.readouterr().out
    for text in ("analytic", "simulated", "activations", "phase of the peak", "16.0 bytes/parameter"):
        assert text in out
    assert main(["estimate", "--model", "gpt2-xxl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown 'gpt2-xxl'" in err
    assert main(["estimate", "--model", "gpt2", "--seq", "0"]) == 2
    assert "seq" in capsys.readouterr().err
