"""Tests for gptcore.memory: the analytic estimate and the fake-tensor simulation against real tracked runs."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys

import pytest
import torch

from gptcore import GPT, MODELS, Recipe, Trainer, get_model, get_recipe
from gptcore.config import GPTConfig
from gptcore.memory import CATEGORIES, Estimate, Simulation, estimate, resolve, simulate, track_training
from gptcore.memory.analytic import param_shapes
from gptcore.presets import MEMORY_RECIPES

pytestmark = pytest.mark.cpu

CPU_SMALL = get_model("cpu-small")
# the recipes the issue names: plain AdamW, checkpointing, gradient accumulation, optimizer in backward, SGD
ISSUE_RECIPES = ("fp32", "checkpoint", "grad-accum", "optim-in-bwd", "sgd-cosine")
GiB = 2**30


def analytic(cfg: GPTConfig, recipe: Recipe, **question) -> Estimate:
    """The estimate of the question ``resolve`` makes of these arguments."""
    return estimate(resolve(cfg, recipe, **question))


def simulated(cfg: GPTConfig, recipe: Recipe, method: str = "auto", **question) -> Simulation:
    """The simulation of the question ``resolve`` makes of these arguments."""
    return simulate(resolve(cfg, recipe, **question), method=method)


@functools.lru_cache
def _simulate_cpu(cfg: GPTConfig, recipe: Recipe) -> Simulation:  # shared by tests
    return simulated(cfg, recipe, method="direct", device="cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """cpu-small's tensors are tiny: intra-op threads only fight the other xdist worker for the 2 cores (a real
    tracked run takes 0.1 s alone and several seconds when they do)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "variant", [dict(), dict(tie_weights=False, vocab_multiple=64)], ids=["tied-unpadded", "untied-padded-to-64"]
)
@pytest.mark.parametrize("name", list(MODELS))
def test_parameter_list_matches_the_model(name, variant):
    """Every parameter (name, numel, decayed or not) in GPT.parameters() order, so that the optimizer's groups and
    the for-loop step's order are right too; built on the meta device (no memory, no init cost)."""
    recipe = Recipe(**variant)
    for cfg in (MODELS[name], dataclasses.replace(MODELS[name], bias=False)):
        with torch.device("meta"):
            model = GPT(cfg, recipe)
        assert param_shapes(cfg, recipe) == [(n, p.numel(), p.dim() >= 2) for n, p in model.named_parameters()]
        assert analytic(cfg, recipe).num_params == model.num_params()


@pytest.mark.parametrize("recipe", ISSUE_RECIPES + ("ckpt-bf16",))
def test_simulation_equals_a_real_tracked_run_on_cpu(recipe):
    """Same bytes, same phase and step, same breakdown in the same categories: the fake run is the real Trainer's
    code path, only without data, and the tracker classifies real and fake storages alike."""
    real = track_training(Trainer(CPU_SMALL, get_recipe(recipe), "cpu"))
    sim = _simulate_cpu(CPU_SMALL, get_recipe(recipe))
    assert (sim.peak_bytes, sim.phase, sim.step) == (real.peak_bytes, real.phase, real.step)
    assert sim.by_category == real.by_category
    assert sum(sim.by_category.values()) == sim.peak_bytes


def test_sgds_update_is_a_small_batchs_peak_and_is_simulated_and_estimated_as_the_cpu_runs_it():
    """One sequence of 8 tokens: SGD's update is the peak. The simulation runs the CPU's own SGD (its for-loop, one
    parameter's temporaries at a time, where CUDA's default is foreach) and equals a real tracked run; the estimate
    holds the for-loop's temporaries of one parameter, and ``loss / accum`` (a 4-byte scalar, a backward temporary:
    made after the forward), which the step holds until it returns."""
    cfg, recipe = dataclasses.replace(CPU_SMALL, batch_size=1, block_size=8), get_recipe("sgd-cosine")
    real = track_training(Trainer(cfg, recipe, "cpu"))
    sim = simulated(cfg, recipe, method="direct", device="cpu")
    est = analytic(cfg, recipe, device="cpu")
    assert real.phase == sim.phase == est.phase == "optimizer"
    assert (sim.peak_bytes, sim.step, sim.by_category) == (real.peak_bytes, real.step, real.by_category)
    assert est.by_category["optimizer temporaries"] == sim.by_category["optimizer temporaries"]
    assert sim.by_category["backward temporaries"] == 4
    assert (est.total_bytes, est.by_category) == (sim.peak_bytes, sim.by_category)


def test_a_real_tracked_run_reports_the_fine_categories():
    """autocast's weight copies, checkpoint's recomputation in backward, and the logits and loss (a large vocabulary
    keeps its log-probabilities in the peak) each have their own category in a real tracked run, as in the
    simulation."""
    real = track_training(Trainer(CPU_SMALL, get_recipe("ckpt-bf16"), "cpu"))
    assert list(real.by_category) == [c for c in CATEGORIES if c in real.by_category]
    assert real.by_category["weight copies"] > 0 and real.by_category["recomputed activations"] > 0
    head_heavy = dataclasses.replace(CPU_SMALL, n_layer=1, vocab_size=4096, batch_size=2, dataset="random")
    real = track_training(Trainer(head_heavy, get_recipe("fp32"), "cpu"))
    sim = simulated(head_heavy, get_recipe("fp32"), method="direct", device="cpu")
    assert real.by_category["logits and loss"] > 0
    assert (real.peak_bytes, real.phase, real.step, real.by_category) == (
        sim.peak_bytes,
        sim.phase,
        sim.step,
        sim.by_category,
    )


@pytest.mark.parametrize("recipe", ISSUE_RECIPES)
def test_the_analytic_total_is_the_simulations_peak(recipe):
    est = analytic(CPU_SMALL, get_recipe(recipe), device="cpu")
    sim = _simulate_cpu(CPU_SMALL, get_recipe(recipe))
    assert est.total_bytes == sim.peak_bytes
    assert est.phase == sim.phase
    assert sum(est.by_category.values()) == est.total_bytes
    # and the same bytes in the same categories: optimizer in backward's second step starts with its token ids
    # (other), not with backward temporaries, though its last update ran inside the first step's backward
    assert est.by_category == sim.by_category


DROPOUT_B1 = dict(dropout=0.1, batch_size=1)  # dropout masks; CPU sdpa's math fallback; bmm without copies
VARIANTS = {
    "bf16": (dict(), dict(precision="bf16")),
    "bf16-pure": (dict(), dict(precision="bf16-pure")),
    "bf16-checkpoint-dropout-b1": (DROPOUT_B1, dict(precision="bf16", checkpoint=True)),
    "manual": (dict(), dict(attention="manual")),
    "manual-dropout-b1": (DROPOUT_B1, dict(attention="manual")),
    "math-bf16": (dict(), dict(attention="math", precision="bf16")),
    "padded-untied-bf16": (dict(), dict(vocab_multiple=64, tie_weights=False, precision="bf16")),
    "padded-tied": (dict(), dict(vocab_multiple=64)),
    # the embedding's gradient at the end of backward, in the padded rows (4,032 of 4,000), is this one's peak
    "padded-tied-head-heavy": (
        dict(n_layer=1, vocab_size=4000, batch_size=1, block_size=8, dataset="random"),
        dict(vocab_multiple=64),
    ),
    "padded-tied-bf16-checkpoint": (dict(), dict(vocab_multiple=64, precision="bf16", checkpoint=True)),
    "for-loop": (dict(), dict(adamw_impl="for-loop")),
    "fused-adamw-small-batch": (dict(batch_size=1, block_size=8), dict(adamw_impl="fused")),
    "bf16-oib-dropout-b1": (DROPOUT_B1, dict(precision="bf16", optim_in_backward=True, grad_clip=None)),
    # one head: the math kernel's scaled q and k, laid out as qkv is, reshape for bmm without copies (sdpa's dropout
    # takes the math kernel on the CPU)
    "math-one-head": (dict(n_head=1), dict(attention="math")),
    "sdpa-dropout-one-head": (dict(n_head=1, dropout=0.1), dict()),
    # the peak is the in-backward step of MLP c_proj's weight, after its bias's step freed the bias's gradient
    "oib-biases": (
        dict(bias=True, n_layer=1, batch_size=2, block_size=8),
        dict(optim_in_backward=True, grad_clip=None),
    ),
    # checkpoint's recomputed input of a Linear dies inside its backward, once the weight's gradient is made and
    # before the bias's (the node holds the only reference)
    "checkpoint-dropout-biases": (dict(bias=True, dropout=0.1), dict(checkpoint=True)),
    "checkpoint-manual-biases": (
        dict(bias=True, n_layer=2, batch_size=2, block_size=16),
        dict(checkpoint=True, attention="manual", adamw_impl="fused"),
    ),
}


@pytest.mark.parametrize("shape, change", VARIANTS.values(), ids=VARIANTS.keys())
def test_analytic_follows_the_code_to_one_scalar(shape, change):
    """The ledger replays model.py and trainer.py op by op, so on the CPU it lands on the simulation's peak to the
    byte, in the same phase and categories (a batch of one sequence with dropout peaks in the optimizer's step, where
    the step still holds ``loss / accum``). A change to the model's ops that the ledger does not follow shows up
    here."""
    cfg, recipe = dataclasses.replace(CPU_SMALL, **shape), Recipe(**change)
    est = analytic(cfg, recipe, device="cpu")
    sim = simulated(cfg, recipe, device="cpu", method="direct")
    assert (est.total_bytes, est.phase, est.by_category) == (sim.peak_bytes, sim.phase, sim.by_category)


@pytest.mark.parametrize("seed", range(4))
def test_the_estimate_is_the_simulations_peak_on_random_small_models(seed):
    """scripts/estimate_sweep.py's draw (1-3 layers, 1-4 heads, dropout, biases, random switches), six models a
    seed: the estimate is the simulation's peak to the byte, in its phase and categories. The fixed shapes above
    name what each case holds; this holds their combinations (random draws found one head's views, a bias's
    in-backward step and checkpoint's recomputed inputs before the estimate followed them)."""
    from scripts.estimate_sweep import configurations, differences

    for cfg, switches, question in configurations(seed, 6):
        delta, sim_phase, est_phase, moved = differences(question)
        assert (delta, moved, est_phase) == (0, {}, sim_phase), (cfg, switches)


@pytest.mark.parametrize("count", ["0", "-3"])
def test_the_sweep_refuses_fewer_than_one_configuration(capsys, count):
    from scripts import estimate_sweep

    with pytest.raises(SystemExit) as stop:
        estimate_sweep.main(["--configs", count])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"estimate_sweep.py: --configs must be at least 1, got {int(count)}\n"


def test_checkpointing_lowers_activations():
    plain, ckpt = get_recipe("fp32"), get_recipe("checkpoint")
    a, b = analytic(CPU_SMALL, plain, device="cpu"), analytic(CPU_SMALL, ckpt, device="cpu")
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
    est = analytic(cfg, recipe, batch=32, seq=1024)
    n = est.num_params
    C, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    assert cfg.bias and recipe.tie_weights and recipe.vocab_multiple == 1
    # per block c_attn 3C x C + 3C, attn c_proj C x C + C, c_fc 4C x C + 4C, mlp c_proj C x 4C + C; the tied lm_head
    linear = L * (12 * C * C + 9 * C) + V * C
    assert est.bytes_per_param == 16
    assert est.states == {
        "parameters": 4 * n,
        "gradients": 4 * n,
        "optimizer state": 8 * n,
        "weight copies": 2 * linear,  # 3,111,324,800 B: every matmul's weight and bias once, in bf16
    }  # LayerNorms and wpe are not copied
    # the whole 16 bytes are live at once in the optimizer step: seen there with a batch too small to matter
    small = dataclasses.replace(CPU_SMALL, batch_size=1, block_size=8)
    n_small = sum(k for _, k, _ in param_shapes(small, recipe))
    for result in (simulated(small, recipe, device="cpu", method="direct"), analytic(small, recipe, device="cpu")):
        assert result.phase == "optimizer"
        by = result.by_category
        assert (by["parameters"], by["gradients"], by["optimizer state"]) == (4 * n_small, 4 * n_small, 8 * n_small)


def test_optimizer_in_backward_saves_little_unless_activations_are_small():
    """The memory-recipe study's puzzle. The gradients of a normal backward pile up towards its END, when the
    activations are already freed, while the peak sits at its START (activations + cross-entropy buffers, no
    gradients yet): freeing each gradient right after its step removes memory that was never part of the peak. With
    checkpointing the activations shrink and the peak moves to where the gradients are."""
    cfg = get_model("gpt2-xl")
    plain, oib = (analytic(cfg, get_recipe(r), batch=32) for r in ("fp32", "optim-in-bwd"))
    assert oib.total_bytes > 0.99 * plain.total_bytes
    assert plain.phase == "backward" and plain.by_category.get("gradients", 0) < 0.01 * plain.total_bytes
    assert plain.at_backward_end["gradients"] == pytest.approx(plain.states["gradients"], rel=1e-4)  # 512-B blocks
    small = dataclasses.replace(CPU_SMALL, batch_size=2)
    assert (
        analytic(small, get_recipe("optim-in-bwd-checkpoint")).total_bytes
        < 0.9 * analytic(small, get_recipe("checkpoint")).total_bytes
    )


@pytest.mark.parametrize("recipe", ["checkpoint", "grad-accum", "optim-in-bwd", "bf16"])
def test_extrapolation_from_2_and_3_layers_is_exact(recipe):
    cfg = dataclasses.replace(CPU_SMALL, n_layer=5)
    direct = simulated(cfg, get_recipe(recipe), device="cpu", method="direct")
    ext = simulated(cfg, get_recipe(recipe), device="cpu", method="extrapolate")
    assert ext.method == "extrapolated from 2 and 3 layers"
    assert (ext.peak_bytes, ext.phase, ext.step, ext.by_category) == (
        direct.peak_bytes,
        direct.phase,
        direct.step,
        direct.by_category,
    )


def test_extrapolation_follows_the_peak_into_another_phase():
    """A small batch and a large vocabulary: with few layers the cross-entropy buffers make backward the peak, with
    many the optimizer step wins. Extending the 2- and 3-layer peaks along one line would miss it; extending every
    segment's peak does not."""

    def cfg(n: int) -> GPTConfig:
        return GPTConfig(n_layer=n, n_head=4, n_embd=128, block_size=8, vocab_size=8192, batch_size=1, dataset="random")

    two, three = (simulated(cfg(n), Recipe(), device="cpu", method="direct") for n in (2, 3))
    assert two.phase == three.phase == "backward"
    direct = simulated(cfg(8), Recipe(), device="cpu", method="direct")
    ext = simulated(cfg(8), Recipe(), device="cpu", method="extrapolate")
    assert direct.phase == "optimizer"
    assert (ext.peak_bytes, ext.phase, ext.by_category) == (direct.peak_bytes, direct.phase, direct.by_category)
    assert ext.peak_bytes > two.peak_bytes + 6 * (three.peak_bytes - two.peak_bytes)


def test_cuda_rounding_and_simulation_agree_with_the_estimate_for_gpt2_xl():
    """The GPT-2 XL question; simulated at 2 and 3 layers and extrapolated (seconds, not the minutes of 48 layers)."""
    cfg, recipe = get_model("gpt2-xl"), get_recipe("bf16")
    for rec in (recipe, dataclasses.replace(recipe, checkpoint=True)):
        sim = simulated(cfg, rec, batch=32, seq=1024)
        est = analytic(cfg, rec, batch=32, seq=1024)
        assert sim.method.startswith("extrapolated")
        assert sim.peak_bytes % 512 == 0
        assert est.total_bytes == sim.peak_bytes
        assert est.phase == sim.phase == "backward"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_estimate_is_the_simulations_peak_to_the_byte_under_every_single_process_recipe(device):
    """The ledger replays model.py and train.py op by op, with CUDA's autocast policy on CUDA and checkpoint's saved
    generator states on the CPU (host memory beside CUDA): on a small model whose loss, blocks and optimizer share the
    peak, its total is the simulation's to the byte under every recipe one process runs. The one exception is
    where the CPU's kernels stand in for CUDA's and the simulation says so: pure bf16's LayerNorm statistics (bf16
    on the CPU, fp32 on CUDA), which the estimate counts as CUDA's: there the two differ by exactly those bytes."""
    from gptcore.presets import RECIPES

    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=512, batch_size=8, dataset="random")
    questions = {}
    for name, recipe in RECIPES.items():
        # liger's fused loss runs Triton kernels, which fake tensors cannot: its estimate stands alone, held to the
        # CUDA allocator by the ladder-9-liger case's measured peak (est/meas 0.998 on the H200)
        if recipe.parallel.ddp is None and recipe.parallel.fsdp2 is None and recipe.kernels.loss == "torch":
            try:
                question = resolve(cfg, recipe, device=device)
            except ValueError:  # what the CPU cannot run (tf32, flash)
                continue
            questions.setdefault(question.recipe, (name, question))  # compile and its budgets: the eager equivalent
    assert len(questions) >= 20
    pure = set()  # the checkpoint switches the pure bf16 branch saw
    for name, question in questions.values():
        est, sim = estimate(question), simulate(question, method="direct")
        if device == "cuda" and question.recipe.precision == "bf16-pure":
            # Each LayerNorm saves a mean and an rstd per row (B x T rows): fp32 (4 B) in the estimate, as CUDA's
            # kernel saves them, bf16 (2 B) in the simulation's CPU kernels. Here 4 x 512 and 2 x 512 B are whole
            # 512-byte blocks, so CUDA's rounding adds nothing to the difference. Pure bf16's peak is in backward
            # before any LayerNorm's backward has run, so every LayerNorm's statistics are held there: two per
            # block and ln_f's, or with checkpoint ln_f's alone (a checkpointed block keeps only its input).
            rows = question.recipe.micro_batch(question.cfg) * question.cfg.block_size
            layernorms = 1 if question.recipe.checkpoint else 2 * question.cfg.n_layer + 1
            assert rows * 2 % 512 == 0, "the statistics must fill whole blocks for the difference to be exact"
            assert est.total_bytes - sim.peak_bytes == layernorms * 2 * (4 - 2) * rows, name
            assert any("LayerNorm" in note for note in sim.notes), name
            pure.add(question.recipe.checkpoint)
        else:
            assert est.total_bytes == sim.peak_bytes, name
    assert pure == ({False, True} if device == "cuda" else set())  # both counts of LayerNorms above were checked


def test_the_generator_state_the_estimate_counts_has_the_installed_torchs_size():
    """Checkpoint keeps ``torch.get_rng_state()`` per block (where the estimate counts it, the byte-exact test above
    shows); the estimate's constant is that tensor's size."""
    from gptcore.memory.tally import CPU_RNG_STATE_BYTES

    assert torch.get_rng_state().nbytes == CPU_RNG_STATE_BYTES


def test_tracking_a_cuda_trainer_rounds_to_the_allocators_blocks_and_leaves_the_hosts_generator_state_out(
    monkeypatch,
):
    """``track_training``'s own tracker for a CUDA trainer: every size in the caching allocator's 512-byte blocks,
    and checkpoint's saved CPU generator states left out (host memory beside a GPU), as the simulation counts a
    CUDA question. A CPU trainer stands in for the GPU's (read as on cuda): the same checkpointed step, tracked as
    on each device, differs by exactly those states."""
    from types import SimpleNamespace

    from gptcore.memory import tracker as tracking
    from tests.helpers import TINY, batches

    made = []

    class Kept(tracking.LiveBytes):
        def __init__(self, **options) -> None:
            super().__init__(**options)
            made.append(self)

    monkeypatch.setattr(tracking, "LiveBytes", Kept)
    recipe, batch = Recipe(checkpoint=True), batches(1)
    cpu, gpu = (Trainer(TINY, recipe, "cpu") for _ in range(2))
    track_training(cpu, batches=list(batch), take_step=cpu.step)
    as_cuda = SimpleNamespace(recipe=recipe, device=torch.device("cuda"), model=gpu.model, optimizers=gpu.optimizers)
    track_training(as_cuda, batches=list(batch), take_step=gpu.step)
    on_cpu, on_cuda = made
    states = [r for r in on_cpu._records if r.nbytes == torch.get_rng_state().nbytes]
    assert states and on_cpu.allocations - on_cuda.allocations == len(states)  # measured: 2 per block, 4 in all
    assert on_cuda.peak % 512 == 0 and all(r.nbytes % 512 == 0 for r in on_cuda._records)


def test_cuda_autocasts_cross_entropy_as_the_simulation_and_the_estimate_assume():
    """A CUDA question is simulated on the CPU with CUDA's autocast policy where the two differ for a GPT
    (``simulation._cuda_autocast``), and estimated the same way. What they assume is read from the installed torch's
    dispatcher: cross_entropy has an entry on the CPU's autocast lists and none on CUDA's (there its log_softmax
    and nll_loss are autocast one by one); log_softmax and softmax have one on CUDA's only; nll_loss on both."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    table = {
        op: (has(op, "AutocastCPU"), has(op, "AutocastCUDA"))
        for op in ("aten::cross_entropy_loss", "aten::log_softmax.int", "aten::softmax.int", "aten::nll_loss")
    }
    assert table == {
        "aten::cross_entropy_loss": (True, False),
        "aten::log_softmax.int": (False, True),
        "aten::softmax.int": (False, True),
        "aten::nll_loss": (True, True),
    }, f"torch {torch.__version__} moved an op between autocast lists: update simulation._cuda_autocast and tally"


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_on_cuda_autocast_keeps_bf16_log_probabilities_and_nll_loss_saves_an_fp32_copy(attention):
    """CUDA's autocast, bf16: log_softmax keeps the logits' bf16 (2 bytes x n saved), nll_loss casts them to fp32
    and saves the copy (4n), and its gradient is the one fp32 logits-sized temporary at the peak (4n); the CPU
    saves fp32 log-probabilities (4n) and holds two fp32 gradients (8n). The H200 measured the CUDA case
    (test_the_estimate_is_within_1_percent_of_the_h200s_allocator_on_gpt2s_eager_cases); simulation and estimate
    agree to the byte on both devices. Slack: the loss, its total_weight and the head's bf16 input (2 x B x T x C)."""
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=8192, batch_size=4, dataset="random")
    n, slack = 4 * 64 * 8192, 4 * 512 + 2 * 4 * 64 * 64
    recipe = Recipe(precision="bf16", attention=attention)
    for device, logprobs, temporaries in (("cuda", 6 * n, 4 * n), ("cpu", 4 * n, 8 * n)):
        est = analytic(cfg, recipe, device=device)
        sim = simulated(cfg, recipe, method="direct", device=device)
        assert (sim.peak_bytes, sim.phase) == (est.total_bytes, est.phase) == (est.total_bytes, "backward")
        for report in (est, sim):
            assert logprobs <= report.by_category["logits and loss"] < logprobs + slack, device
            assert temporaries <= report.by_category["backward temporaries"] < temporaries + slack, device


def test_checkpoints_recomputation_makes_cudas_autocast_dtypes_in_the_simulation():
    """CUDA's autocast runs softmax in fp32; checkpoint's recomputation runs inside backward and must make the fp32
    probabilities the forward saved, or checkpoint fails on the dtype it checks. The CUDA simulation used to make
    the CPU's bf16 there (``estimate --recipe bf16 --checkpoint --set attention=manual --simulate`` ended in a
    CheckpointError); it runs now, and lands on the estimate."""
    recipe = Recipe(precision="bf16", checkpoint=True, attention="manual")
    est = analytic(CPU_SMALL, recipe, device="cuda")
    sim = simulated(CPU_SMALL, recipe, method="direct", device="cuda")
    assert (sim.peak_bytes, sim.phase, sim.by_category) == (est.total_bytes, est.phase, est.by_category)


def test_estimate_is_arithmetic():
    """No tensor is made: the analytic estimate runs without even loading torch, and what it works out there is
    what it works out beside torch, to the byte, and the sum of the breakdown it prints. That figure, GPT-2 XL's
    bf16 peak, is the simulation's to the byte (test_cuda_rounding_and_simulation_agree_with_the_estimate_for_gpt2_xl
    runs the real Trainer on fake tensors for it)."""
    code = (
        "import sys\n"
        "from gptcore.presets import get_model, get_recipe\n"
        "from gptcore.memory import estimate, resolve\n"
        "est = estimate(resolve(get_model('gpt2-xl'), get_recipe('bf16'), batch=32, seq=1024))\n"
        "print(est.total_bytes, sum(est.by_category.values()), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    total, summed, torch_loaded = out.stdout.split()
    assert torch_loaded == "False"
    beside_torch = analytic(get_model("gpt2-xl"), get_recipe("bf16"), batch=32, seq=1024)
    assert int(total) == int(summed) == beside_torch.total_bytes


def test_compile_and_cuda_only_switches_are_mapped_with_a_note_or_refused():
    cfg = get_model("gpt2")
    pinned = dataclasses.replace(get_recipe("ladder-5"), attention="flash")  # compile, sdpa pinned to flash
    question = resolve(cfg, pinned)
    assert (question.recipe.compile, question.recipe.attention) == (False, "sdpa")
    est = estimate(question)
    assert est.notes == question.notes
    assert any("compile" in n for n in est.notes) and any("flash" in n for n in est.notes)
    assert (
        est.total_bytes
        == analytic(
            cfg, dataclasses.replace(get_recipe("ladder-5"), compile=False, attention="sdpa", precision="bf16")
        ).total_bytes
    )
    with pytest.raises(ValueError, match="flash"):
        resolve(CPU_SMALL, pinned, device="cpu")
    with pytest.raises(ValueError, match="tf32"):
        resolve(CPU_SMALL, get_recipe("tf32"), device="cpu")


def test_what_the_estimate_answers_in_place_of_the_recipe_is_said_in_a_note():
    """A fit_memory recipe is answered at the batch given (gptcore.memory.fit chooses the batch), and sdpa with dropout
    on the CPU as the math kernel it falls back to (T x T probabilities saved): each says so, and a question that
    needs neither has no note."""
    fit = resolve(get_model("gpt2"), get_recipe("ladder-9"))
    assert fit.recipe.fit_memory is None
    assert [n for n in fit.notes if n.startswith("fit_memory")] == [
        "fit_memory 0.85: the batch given here (gptcore.memory.fit chooses it)"
    ]
    dropout, sdpa = dataclasses.replace(CPU_SMALL, dropout=0.1), Recipe(attention="sdpa")
    [note] = resolve(dropout, sdpa, device="cpu").notes
    assert note.startswith("dropout > 0 on the CPU: sdpa falls back to its math kernel")
    assert resolve(dropout, sdpa, device="cuda").notes == resolve(CPU_SMALL, sdpa, device="cpu").notes == ()


def test_on_cuda_sdpa_with_dropout_keeps_no_t_by_t_matrix_where_the_cpus_math_fallback_does():
    """On CUDA the fused kernel runs dropout itself: dropout adds its masks, less than one fp32 probability matrix
    per layer (B x H x T x T x 4 B), which the CPU's math kernel keeps in each layer (and more beside)."""
    dropout, sdpa = dataclasses.replace(CPU_SMALL, dropout=0.1), Recipe(attention="sdpa")
    matrices = dropout.n_layer * dropout.batch_size * dropout.n_head * dropout.block_size**2 * 4
    added = {
        device: analytic(dropout, sdpa, device=device).at_forward_end["activations"]
        - analytic(CPU_SMALL, sdpa, device=device).at_forward_end["activations"]
        for device in ("cpu", "cuda")
    }
    assert 0 < added["cuda"] < matrices < added["cpu"]


@pytest.mark.parametrize("precision, copied", [("fp32", False), ("bf16-pure", False), ("fp16", True), ("bf16", True)])
def test_only_autocast_holds_weight_copies(precision, copied):
    """Autocast's low-precision copies of the matmul weights are a state of fp16 and bf16 autocast only: fp32 has no
    copy, and pure bf16's weights are already bf16 (``estimate`` prints them beside the bytes per parameter)."""
    est = analytic(get_model("gpt2"), Recipe(precision=precision, attention="sdpa"))
    assert (est.states["weight copies"] > 0) is copied
    assert ("weight copies" in est.at_forward_end) is copied


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(device="tpu"), "device"), (dict(batch=0), "batch"), (dict(seq=-8), "seq"), (dict(batch=10), "divide")],
)
def test_bad_input_is_a_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        resolve(CPU_SMALL, get_recipe("grad-accum"), **kwargs)


def test_seq_longer_than_the_preset_replaces_block_size():
    longer = analytic(CPU_SMALL, get_recipe("fp32"), seq=128, device="cpu")
    base = analytic(CPU_SMALL, get_recipe("fp32"), device="cpu")
    assert longer.num_params == base.num_params + 64 * CPU_SMALL.n_embd  # the position table grows
    assert longer.at_forward_end["activations"] > 1.9 * base.at_forward_end["activations"]


def test_table_sizes_are_in_one_unit_read_off_the_numbers():
    """cpu-small's tens of MiB read in MiB (not 0.00 GiB), GPT-2 XL's in GiB; the header names the unit, and a
    simulated column sits beside the analytic one."""
    small = analytic(CPU_SMALL, get_recipe("checkpoint"), device="cpu")
    table = small.table(_simulate_cpu(CPU_SMALL, get_recipe("checkpoint")))
    header, _, *rows = table.splitlines()
    assert header.split() == ["MiB", "analytic", "simulated"]
    peak = next(row for row in rows if row.startswith("peak "))
    assert peak.split()[1] == f"{small.total_bytes / 2**20:,.2f}"
    assert "recomputed activations" in table and "phase of the peak" in table and "backward, step 2" in table
    xl = analytic(get_model("gpt2-xl"), get_recipe("bf16"), batch=32, seq=1024)
    header, _, *rows = xl.table().splitlines()
    assert header.split() == ["GiB", "analytic"]
    assert next(row for row in rows if row.startswith("peak ")).split()[1] == f"{xl.total_bytes / GiB:,.2f}"


def test_the_estimate_is_within_1_percent_of_the_h200s_allocator_on_gpt2s_eager_cases():
    """GPT-2 124M on the H200 (torch 2.11.0+cu130), eager: the ladder's first four rungs (fp32, TF32 twice, bf16
    autocast; manual attention) and tests/test_estimate_gpu.py's bf16 autocast with sdpa. Each measured peak is
    74,252,800-79,614,464 B above the estimate, as deep-1.6b's are 68-69 MB above theirs (the CUDA libraries'
    workspaces). 1% of GPT-2's 16-31 GB peaks would let a whole activation go missing from the estimate unnoticed,
    so the range is held exactly, as the deep-1.6b test below holds its own: the logs are fixed and the estimate is
    arithmetic. Before the estimate followed CUDA's autocast through cross-entropy, both bf16 cases were 1.57 GB
    below it (1.05x and 1.10x)."""
    from gptcore.gate import results
    from tests.test_gate import ROOT

    data, cfg, seen, gaps = ROOT / "tests" / "data" / "gpu-h200", get_model("gpt2"), [], []
    cases = []
    for record in results.read(data / "ladder.jsonl"):
        recipe = get_recipe(record.name.removeprefix("test_ladder[gpt2-").removesuffix("]"))
        if not recipe.compile:  # the estimate treats a compiled recipe as its eager equivalent
            cases.append((record.name, recipe, record.entry["peak_allocated_bytes"]))
    text = (data / "estimate-gpu.txt").read_text()
    measured = int(text.split("gpt2 bf16: measured ", 1)[1].split(" B", 1)[0].replace(",", ""))
    cases.append(("tests/test_estimate_gpu.py", get_recipe("bf16"), measured))
    for name, recipe, measured in cases:
        est = analytic(cfg, recipe, batch=cfg.batch_size, seq=cfg.block_size, device="cuda")
        assert 0 < measured - est.total_bytes < 0.01 * measured, name
        seen.append((recipe.precision, recipe.attention))
        gaps.append(measured - est.total_bytes)
    assert seen == [("fp32", "manual"), ("tf32", "manual"), ("tf32", "manual"), ("bf16", "manual"), ("bf16", "sdpa")]
    assert (min(gaps), max(gaps)) == (74_252_800, 79_614_464)


# The H200's clean deep-1.6b peaks (tests/data/gpu-h200): the first session's memory stage's first five cases and the
# two run alone (that stage's last two peaks held what an earlier optimizer-in-backward case had left allocated), and
# the second session's whole stage, the leak fixed (ten recipes; its deadline left optim-in-bwd-budget-0.05 out).
H200_CLEAN = {
    "memory.jsonl": ("fp32", "bf16-pure", "checkpoint", "compile", "optim-in-bwd"),
    "memory-alone.jsonl": ("optim-in-bwd-checkpoint",),
    "memory-budget-0.05.jsonl": ("budget-0.05",),
    "memory-record.jsonl": tuple(r for r in MEMORY_RECIPES if r != "optim-in-bwd-budget-0.05"),
}


def test_the_estimate_is_within_1_percent_of_the_h200s_allocator_on_every_clean_deep_case():
    """The GPU truth for the estimator: deep-1.6b on an H200 (torch 2.11.0+cu130), max_memory_allocated against the
    analytic estimate. Every measured peak is 67,959,296-69,036,544 B above it (the CUDA libraries' workspaces,
    0.2-0.6% of 11-34 GB), so 1% holds; the simulation agreed as closely where it ran (0.9969-0.9980). The range is
    held exactly, as docs/memory.md quotes it: the logs are fixed and the estimate is arithmetic, so a change to
    the estimator that moves a deep-1.6b figure shows here."""
    from gptcore.gate import results
    from tests.test_gate import ROOT

    cfg, seen, gaps = get_model("deep-1.6b"), [], []
    for log, recipes in H200_CLEAN.items():
        for record in results.read(ROOT / "tests" / "data" / "gpu-h200" / log):
            recipe = record.name.removeprefix("test_memory_recipes[deep-1.6b-").removesuffix("]")
            if recipe in recipes and record.entry:
                est = analytic(cfg, get_recipe(recipe), batch=cfg.batch_size, seq=cfg.block_size, device="cuda")
                measured = record.entry["peak_allocated_bytes"]
                assert 0 < measured - est.total_bytes < 0.01 * measured, recipe
                seen.append(recipe)
                gaps.append(measured - est.total_bytes)
    assert sorted(seen) == sorted(r for recipes in H200_CLEAN.values() for r in recipes)
    assert (min(gaps), max(gaps)) == (67_959_296, 69_036_544)
