"""Presets are what they claim (nanoGPT's configs, the studies' grids), old names still work with a deprecation
line, and invalid configs are refused with a ValueError naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from gptcore.config import CHAR_VOCAB, Recipe
from gptcore.config.fields import flat  # every field, a nested group's by its dotted name (as --set names them)
from gptcore.presets import (
    LADDER,
    MEMORY_RECIPES,
    MODEL_NOTES,
    MODELS,
    RECIPE_NOTES,
    RECIPES,
    RENAMED_RECIPES,
    STUDIES,
    get_model,
    get_recipe,
)
from gptcore.training.data import CORPORA, load_corpus
from gptcore.training.trainer import UnsupportedRecipe, check_runnable

pytestmark = pytest.mark.cpu


def test_every_study_names_registered_models_and_recipes_with_notes():
    for study in STUDIES.values():
        assert set(study.models) <= set(MODELS) and set(study.recipes) <= set(RECIPES), study.name
    assert set(MEMORY_RECIPES) <= set(RECIPES) and len(MEMORY_RECIPES) == 11
    assert MODELS.keys() == MODEL_NOTES.keys() and RECIPES.keys() == RECIPE_NOTES.keys()
    assert all(MODEL_NOTES.values()) and all(RECIPE_NOTES.values())
    assert RECIPE_NOTES["ladder-0"] == "ladder rung 0: fp32, naive loop" and RECIPE_NOTES["ladder-3"].endswith("+ amp")


def test_char_vocab_is_the_corpus_alphabet_and_the_corpora_are_one_list():
    assert CHAR_VOCAB == load_corpus("shakespeare").vocab_size
    from gptcore.config import DATASETS

    assert CORPORA is DATASETS


def test_char_presets_are_nanogpts_shakespeare_char_and_cpu_command():
    # nanoGPT: train.py defaults to bias=False and config/train_shakespeare_char.py keeps it; its CPU command runs
    # 4 layers x 4 heads x 128, block 64, batch 12, dropout 0, lr decay to 2000
    char, cpu = MODELS["char"], MODELS["cpu-small"]
    assert (char.n_layer, char.n_head, char.n_embd, char.block_size, char.batch_size, char.dropout, char.bias) == (
        6,
        6,
        384,
        256,
        64,
        0.2,
        False,
    )
    assert (cpu.n_layer, cpu.n_head, cpu.n_embd, cpu.block_size, cpu.batch_size, cpu.dropout, cpu.bias) == (
        4,
        4,
        128,
        64,
        12,
        0.0,
        False,
    )
    assert all(not MODELS[m].bias for m in MODELS if m.startswith(("char", "cpu-")))
    assert all(MODELS[m].bias for m in MODELS if m.startswith("gpt2"))  # GPT-2 has biases
    fp32 = RECIPES["fp32"]  # nanoGPT char: lr 1e-3 -> 1e-4, warmup 100, cosine decay to 5000, beta2 0.99, clip 1
    assert (
        fp32.lr,
        fp32.min_lr,
        fp32.schedule,
        fp32.warmup_steps,
        fp32.decay_steps,
        fp32.beta2,
        fp32.grad_clip,
        fp32.weight_decay,
    ) == (1e-3, 1e-4, "cosine", 100, 5000, 0.99, 1.0, 0.1)
    assert all(RECIPES[r].decay_steps == 2000 and RECIPES[r].checkpoint for r in STUDIES["cpu-shape"].recipes)


def test_the_cpu_variants_have_their_own_names():
    cpu = MODELS["cpu-small"]
    assert RECIPES["half-batch"].batch_size(cpu) == 6 and RECIPES["small-batch"].batch_size(cpu) == 3
    assert RECIPES["grad-accum-2"].micro_batch(cpu) == 6 and RECIPES["grad-accum"].micro_batch(cpu) == 3


@pytest.mark.parametrize("old,new", sorted(RENAMED_RECIPES.items()))
def test_old_recipe_names_still_work_with_a_deprecation_warning(old, new):
    assert old not in RECIPES and new in RECIPES
    with pytest.warns(FutureWarning, match=f"{old!r} is now called {new!r}"):
        assert get_recipe(old) is RECIPES[new]


def test_optimizer_in_backward_recipes_are_named_for_it_and_fused_adamw_is_not():
    in_backward = {name for name, r in RECIPES.items() if r.optim_in_backward}
    assert in_backward and all("optim-in-bwd" in name for name in in_backward)
    assert not any("fused" in name for name in RECIPES)
    assert all(RECIPES[n].precision == "bf16-pure" for n in RECIPES if n.startswith("bf16-pure"))


def test_doubled_presets_double_one_dimension():
    base = get_model("char")
    for name, field in [("char-ctx2", "block_size"), ("char-layers2", "n_layer"), ("char-embd2", "n_embd")]:
        assert getattr(MODELS[name], field) == 2 * getattr(base, field)
        assert dataclasses.replace(MODELS[name], **{field: getattr(base, field)}) == base


# what the ladder adds at each rung, as Recipe fields (workers: worker processes and pinned memory)
LADDER_CHANGES = [
    {"precision"},
    {"sync_every_step"},
    {"precision"},
    {"compile"},
    {"attention"},
    {"vocab_multiple"},
    {"tie_weights"},
    {"num_workers", "pin_memory"},
    {"fit_memory"},
    {"compile_mode"},
]


def test_each_ladder_rung_adds_exactly_one_switch():
    assert len(LADDER) == len(LADDER_CHANGES) + 1
    for lower, upper, expected in zip(LADDER[:-1], LADDER[1:], LADDER_CHANGES, strict=True):
        a, b = flat(RECIPES[lower]), flat(RECIPES[upper])
        changed = {name for name in a if a[name] != b[name]}
        assert changed == expected, upper
    fitted, a, b = (flat(RECIPES[name]) for name in ("ladder-9", "ladder-9-liger", "ladder-9-liger-fp8"))
    assert {name for name in a if a[name] != fitted[name]} == {"kernels.loss"}  # beside the ladder: one switch each
    assert {name for name in a if a[name] != b[name]} == {"kernels.fp8"}
    top = RECIPES["ladder-8"]  # the seed's top rung: nanoGPT's train.py step
    assert (top.precision, top.compile, top.attention, top.vocab_multiple, top.tie_weights, top.adamw_impl) == (
        "bf16",
        True,
        "sdpa",  # the seed's "flash attention": sdpa's own dispatch (cuDNN's kernel on Hopper, flash on an A100)
        64,
        True,
        "fused",
    )


@pytest.mark.parametrize(
    "fields,field",
    [
        (dict(n_embd=100, n_head=3), "n_embd"),
        (dict(n_layer=0), "n_layer"),
        (dict(dropout=1.0), "dropout"),
        (dict(dataset="wiki"), "dataset"),
        (dict(vocab_size=50), "vocab_size"),
    ],
)
def test_invalid_model_shapes_name_the_field(fields, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        dataclasses.replace(MODELS["cpu-small"], **fields)


@pytest.mark.parametrize(
    "fields,field",
    [
        (dict(memory_budget=0.5), "memory_budget"),
        (dict(compile=True, memory_budget=1.5), "memory_budget"),
        (dict(optim_in_backward=True), "grad_clip"),
        (dict(optim_in_backward=True, grad_clip=None, grad_accum_steps=2), "grad_accum_steps"),
        (dict(optim_in_backward=True, grad_clip=None, precision="fp16"), "precision"),
        (dict(attention="flash"), "attention"),
        (dict(attention="cudnn"), "attention"),
        (dict(precision="fp8"), "precision"),
        (dict(grad_accum_steps=0), "grad_accum_steps"),
        (dict(grad_clip=0.0), "grad_clip"),  # clip_grad_norm_ would erase every gradient
        (dict(grad_clip=-1.0), "grad_clip"),  # and below 0 turn descent into ascent
        (dict(lr=float("inf")), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(beta1=1.0), "beta1"),
        (dict(beta2=-0.1), "beta2"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(momentum=float("nan")), "momentum"),
        (dict(seed=-1), "seed"),
        # a name of none of a switch's choices: one line naming them, never a silent fallback to another choice
        (dict(attention="flsh"), "attention"),
        (dict(optimizer="adam"), "optimizer"),
        (dict(adamw_impl="fast"), "adamw_impl"),
        (dict(schedule="linear"), "schedule"),
        (dict(compile=True, compile_scope="layers"), "compile_scope"),
        (dict(compile=True, compile_mode="max"), "compile_mode"),
        (dict(batch_divisor=0), "batch_divisor"),
        (dict(vocab_multiple=0), "vocab_multiple"),
        (dict(decay_steps=0), "decay_steps"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(num_workers=-1), "num_workers"),
        (dict(lr=0.01, min_lr=0.1), "min_lr"),
        (dict(compile_scope="blocks"), "compile_scope"),  # regional compiling without compiling
        (dict(fit_memory=0.5, batch_divisor=2), "batch_divisor"),  # the fit chooses the batch
        (dict(kernels="liger"), "kernels"),
        (dict(compile=True, memory_budget=-0.1), "memory_budget"),
    ],
)
def test_invalid_recipes_name_the_field(fields, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        Recipe(**fields)


def test_a_grad_accumulation_or_batch_divisor_that_does_not_divide_the_batch_is_refused():
    with pytest.raises(ValueError, match="^grad_accum_steps:.*does not divide"):
        Recipe(grad_accum_steps=5).micro_batch(MODELS["cpu-small"])  # batch 12
    with pytest.raises(ValueError, match="^batch_divisor: 5 does not divide the batch of 12$"):
        Recipe(batch_divisor=5).batch_size(MODELS["cpu-small"])


def test_the_vocabulary_is_padded_up_to_its_multiple_and_never_cut():
    gpt2 = MODELS["gpt2"]  # 50,257 tokens
    assert [Recipe(vocab_multiple=k).vocab_rows(gpt2) for k in (1, 64, 50_257)] == [50_257, 50_304, 50_257]


@pytest.mark.parametrize(
    "recipe,reason",
    [
        (Recipe(precision="tf32"), r"tf32 is a CUDA tensor-core mode; on CPU it would silently run as fp32"),
        (
            Recipe(precision="bf16", attention="flash"),
            r"flash attention needs a CUDA GPU \(compute capability >= 8\.0\); this run is on cpu",
        ),
        (
            Recipe(precision="bf16", attention="efficient"),
            r"efficient attention needs a CUDA GPU \(compute capability >= 5\.0\); this run is on cpu",
        ),
        (
            Recipe(precision="bf16", attention="cudnn"),
            r"cudnn attention needs a CUDA GPU \(compute capability >= 8\.0\); this run is on cpu",
        ),
    ],
)
def test_recipes_the_cpu_cannot_run_are_refused_not_run_as_something_else(recipe, reason):
    """Each refusal is for its own reason, in full: the switch that the CPU cannot honour, and what it would need."""
    with pytest.raises(UnsupportedRecipe, match=f"^{reason}$"):
        check_runnable(recipe, "cpu")


def test_unknown_names_suggest_the_closest_and_list_the_choices():
    with pytest.raises(ValueError, match="choose from char, char-ctx2"):
        get_model("nope")
    with pytest.raises(ValueError, match="did you mean 'cpu-small'"):
        get_model("cpu-smal")
    with pytest.raises(ValueError, match="did you mean 'optim-in-bwd'"):
        get_recipe("optim-in-bw")
