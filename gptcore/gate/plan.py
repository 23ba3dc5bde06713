"""How long a benchmark case will take, before it runs: from its own history when there is one (the wall time a
results log or its baseline entry recorded), else from the analytic FLOPs of its steps at an assumed throughput.
``--deadline`` starts no case that would likely end after it; ``scripts/gpu_stage.py plan`` prints each GPU stage's
cases with this estimate, so that a stage can be checked against its 9-minute call before a GPU is at hand.

The stated assumptions (a planning figure, never a measurement):
- a GPU runs at :data:`ASSUMED_MFU` of the H100 SXM's dense peak for the recipe's precision (fp32 on CUDA cores,
  TF32 or 16-bit on tensor cores); a CPU at :data:`CPU_FLOPS` (fp32; bf16 is emulated on CPUs without native bf16);
- building a case costs :data:`SETUP_SECONDS`, and a compiled recipe :func:`compile_seconds` more;
- a case with history is planned at its last wall time x :data:`HISTORY_MARGIN`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gptcore.config import GPTConfig, Recipe, Schedule
from gptcore.presets import MODELS, RECIPES

ASSUMED_MFU = 0.30
"""Share of the GPU's dense peak a training step reaches (nanoGPT-sized models, eager or compiled)."""
PLAN_GPU = "H100 SXM"
"""The GPU a plan assumes when no GPU is present."""
CPU_FLOPS = {"fp32": 60e9, "16-bit": 6e9}
"""FLOP/s of a training step on 2 CPU cores (cpu-small ran at ~90 GFLOP/s on a 2-core EPYC 9004); 16-bit is bf16,
emulated about 10x slower on CPUs without AVX512-BF16."""
SETUP_SECONDS = {"cpu": 1.0, "cuda": 5.0}
"""Building the model and optimizer, the first CUDA context, the estimate, the report."""
HISTORY_MARGIN = 1.15
"""A case planned from its history: its last wall time plus 15%."""
OTHER_SECONDS = 30.0
"""A test that is not a study case (the smoke stage's checks on a tiny model) and states no time of its own: a test
that takes longer says so with ``@pytest.mark.planned(seconds, why=...)``."""
PLAN_GPUS = 1
"""GPUs a plan assumes when none is present (a lent machine has one): a 2-rank case then skips itself."""
TRACKED_PASS_COST = 3.0
"""The CPU tracked pass (2 steps under the live-bytes tracker) costs about this many plain steps per step."""


AUTOTUNE_SECONDS = 240.0
"""What compile's autotuning modes add (max-autotune benchmarks each matmul's and pointwise kernel's candidate
configurations, forward and backward; CUDA graphs are recorded during the warm-up). Assumed for bf16 matmuls: on an
H200 the FP8 rung under max-autotune-no-cudagraphs (FP8's scaled matmuls bring candidates of their own) was still
running 346 s after it started, where the same rung without autotuning took 88 s whole (tests/data/gpu-h200-fitted).
An autotuned rung therefore runs in a job of its own, whatever its plan says (docs/gpu.md)."""
COORDINATE_DESCENT_SECONDS = 120.0
"""What tuning each generated kernel by coordinate descent adds, unmeasured: ladder-8's step has 37 distinct
generated kernels (tests/data/gpu-h200-detached-logits/profile-ladder-8.txt), and coordinate descent compiles and
times a few candidate launch configurations of each, about a second a candidate."""
PLAN_MEMORY_BYTES = 150_121_545_728
"""The device memory a fitted batch (Recipe.fit_memory) is planned for: an H200's, the largest lent GPU, so that
the plan is not short on either."""


def compile_seconds(cfg: GPTConfig, recipe: Recipe) -> float:
    """Assumed cold-compile time: 30 s, and 1 s a block for the whole model (the blocks' kernels are alike, so
    inductor's code cache serves most of them); regional compilation compiles one block; an autotuning mode adds
    :data:`AUTOTUNE_SECONDS`, coordinate descent :data:`COORDINATE_DESCENT_SECONDS` more."""
    if not recipe.compile:
        return 0.0
    autotune = AUTOTUNE_SECONDS if "autotune" in recipe.compile_mode else 0.0
    autotune += COORDINATE_DESCENT_SECONDS if "coordinate-descent" in recipe.compile_mode else 0.0
    return 30.0 + (1.0 if recipe.compile_scope == "blocks" else 1.0 * cfg.n_layer) + autotune


def flops_per_token(cfg: GPTConfig, recipe: Recipe) -> float:
    """Training FLOPs per token, as gptcore.training.model.GPT.flops_per_token counts them (6 x matmul weights +
    12 L d T), without building the model; checkpointing recomputes the blocks' forward (+1/3 of their work)."""
    d, layers = cfg.n_embd, cfg.n_layer
    blocks = 6 * 12 * d * d * layers + 12 * layers * d * cfg.block_size
    if recipe.checkpoint:
        blocks *= 4 / 3
    return blocks + 6 * recipe.vocab_rows(cfg) * d


def step_seconds(cfg: GPTConfig, recipe: Recipe, device: str, world: int = 1) -> float:
    """Assumed seconds of one optimizer step."""
    from gptcore.measure.timing import PEAK_TFLOPS  # the datasheet table (imports torch when called)

    klass = "fp32" if recipe.precision == "fp32" else "tf32" if recipe.precision == "tf32" else "16-bit"
    if device == "cuda":
        rate = PEAK_TFLOPS[PLAN_GPU][klass] * 1e12 * ASSUMED_MFU * world
    else:
        rate = CPU_FLOPS["fp32" if klass != "16-bit" else "16-bit"]
    return recipe.tokens_per_step(cfg) * flops_per_token(cfg, recipe) / rate


def case_seconds(
    model: str,
    recipe_name: str,
    device: str,
    *,
    warmup: int = 0,
    rounds: int = 0,
    steps_per_round: int = 0,
    loss_step: int | None = None,
    schedule: Schedule | None = None,
    world: int = 1,
) -> float:
    """Assumed wall time of a benchmark case (warm-up, timed rounds, the ledger's step, on CPU the tracked pass)
    or of a convergence case (``schedule``: its steps and evaluations)."""
    cfg, recipe = MODELS[model], RECIPES[recipe_name]
    if recipe.fit_memory is not None:  # the batch that fills the device: its step is that much longer
        from gptcore.memory.fit import fitted

        cfg = fitted(cfg, recipe, device, PLAN_MEMORY_BYTES if device == "cuda" else None)
    step = step_seconds(cfg, recipe, device, world)
    if schedule is not None:
        evals = len(schedule.eval_steps) * schedule.eval_batches / 3  # a forward is a third of a step
        steps = schedule.steps + evals
    else:
        steps = max(warmup + rounds * steps_per_round, loss_step or 0) + 1
        if device == "cpu" and not recipe.compile:
            steps += 2 * TRACKED_PASS_COST
    return SETUP_SECONDS[device] + compile_seconds(cfg, recipe) + steps * step


def gpus_for_plan(device: str) -> int:
    """The GPUs a case on ``device`` will see: those present, else PLAN_GPUS; a CPU case runs its ranks anyway."""
    if device != "cuda":
        return 1 << 30
    import torch

    return torch.cuda.device_count() or PLAN_GPUS


@dataclass(frozen=True)
class Estimate:
    """A case's planned wall time and where it comes from ('results log', 'baseline' or 'assumed')."""

    seconds: float
    source: str


def item_case(item: Any) -> dict | None:
    """What a collected benchmark item runs: model, recipe, device, timing or schedule, world; None when it is
    not a study case (its module has no STUDY)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    module = getattr(item, "module", None)
    study = getattr(module, "STUDY", None)
    if "model" not in params or "recipe" not in params or (study is None and "device" not in params):
        return None
    device = params.get("device") or study.device
    timing = getattr(module, "TIMING", None)
    timing = timing.get(device) if isinstance(timing, dict) else timing
    schedule = getattr(module, "SCHEDULE", None) if timing is None else None
    if timing is None and schedule is None and study is not None and "convergence" in item.name:
        schedule = study.schedule
    return {
        "model": params["model"],
        "recipe": params["recipe"],
        "device": device,
        "timing": timing,
        "schedule": schedule,
        "world": params.get("world", 1),
    }


def estimate(
    item: Any,
    history: dict[str, float],
    overrides: tuple[int | None, int | None, int | None] = (None,) * 3,
    baseline_seconds: float | None = None,
) -> Estimate:
    """The planned wall time of ``item``: its last time in a results log (``history``: node id -> seconds), else
    its baseline entry's, else the assumed time from its FLOPs (with --bench-warmup/rounds/steps applied)."""
    if item.nodeid in history:
        return Estimate(history[item.nodeid] * HISTORY_MARGIN, "results log")
    if baseline_seconds:
        return Estimate(baseline_seconds * HISTORY_MARGIN, "baseline")
    case = item_case(item)
    if case is None:
        marker = item.get_closest_marker("planned") if hasattr(item, "get_closest_marker") else None
        if marker is not None:
            return Estimate(float(marker.args[0]), f"assumed ({marker.kwargs.get('why', 'its planned marker')})")
        return Estimate(OTHER_SECONDS, f"assumed (a plain test: {OTHER_SECONDS:.0f} s)")
    if case["world"] > gpus_for_plan(case["device"]):
        return Estimate(0.0, f"skipped: needs {case['world']} GPUs")
    timing = case["timing"]
    counts = {}
    if timing is not None:
        w, r, s = overrides
        counts = {
            "warmup": timing.warmup if w is None else w,
            "rounds": timing.rounds if r is None else r,
            "loss_step": getattr(timing, "loss_step", None),
            "steps_per_round": timing.steps_per_round if s is None else s,
        }
    seconds = case_seconds(
        case["model"], case["recipe"], case["device"], schedule=case["schedule"], world=case["world"], **counts
    )
    return Estimate(seconds, "assumed")
