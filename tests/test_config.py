"""Presets exist as DESIGN lists them, and invalid configs are refused with a ValueError naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from gptcore.config import CHAR_VOCAB, LADDER, MEMORY_RECIPES, MODELS, RECIPES, GPTConfig, Recipe, get_model
from gptcore.data import shakespeare_vocab_size
from gptcore.train import UnsupportedRecipe, check_runnable

pytestmark = pytest.mark.cpu

DESIGN_RECIPES = ["fp32", "sgd-cosine", "fp16", "bf16", "small-batch", "grad-accum", "checkpoint", "compile",
                  "fused-optim", "fused-checkpoint", "bf16-fused-checkpoint", "budget-0.05", "budget-0.60",
                  "fused-budget-0.05", "bf16-budget-0.60"] + [f"ladder-{i}" for i in range(9)]
DESIGN_MODELS = ["char", "char-ctx2", "char-layers2", "char-embd2", "cpu-small", "cpu-heads2", "cpu-layers2",
                 "cpu-embd2", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "deep-1.6b"]


def test_every_preset_of_the_design_exists():
    assert set(DESIGN_MODELS) <= set(MODELS) and set(DESIGN_RECIPES) <= set(RECIPES)
    assert set(MEMORY_RECIPES) <= set(RECIPES) and len(MEMORY_RECIPES) == 11


def test_char_vocab_is_the_corpus_alphabet():
    assert CHAR_VOCAB == shakespeare_vocab_size()


def test_doubled_presets_double_one_dimension():
    base = get_model("char")
    for name, field in [("char-ctx2", "block_size"), ("char-layers2", "n_layer"), ("char-embd2", "n_embd")]:
        assert getattr(MODELS[name], field) == 2 * getattr(base, field)
        assert dataclasses.replace(MODELS[name], **{field: getattr(base, field)}) == base


# what seed 004's ladder adds at each rung, as Recipe fields (workers: worker processes and pinned memory)
LADDER_CHANGES = [{"precision"}, {"sync_every_step"}, {"precision"}, {"compile"}, {"attention"},
                  {"vocab_multiple"}, {"tie_weights"}, {"num_workers", "pin_memory"}]


def test_each_ladder_rung_adds_exactly_one_switch():
    assert len(LADDER) == len(LADDER_CHANGES) + 1
    for lower, upper, expected in zip(LADDER[:-1], LADDER[1:], LADDER_CHANGES, strict=True):
        a, b = RECIPES[lower], RECIPES[upper]
        changed = {f.name for f in dataclasses.fields(Recipe) if getattr(a, f.name) != getattr(b, f.name)}
        assert changed == expected, upper
    top = RECIPES[LADDER[-1]]
    assert (top.precision, top.compile, top.attention, top.vocab_multiple, top.tie_weights, top.adamw_impl) == (
        "bf16", True, "flash", 64, True, "fused")


@pytest.mark.parametrize("fields,field", [
    (dict(n_embd=100, n_head=3), "n_embd"),
    (dict(n_layer=0), "n_layer"),
    (dict(dropout=1.0), "dropout"),
    (dict(dataset="wiki"), "dataset"),
    (dict(vocab_size=50), "vocab_size"),
])
def test_invalid_model_shapes_name_the_field(fields, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        dataclasses.replace(MODELS["cpu-small"], **fields)


@pytest.mark.parametrize("fields,field", [
    (dict(memory_budget=0.5), "memory_budget"),
    (dict(compile=True, memory_budget=1.5), "memory_budget"),
    (dict(optim_in_backward=True), "grad_clip"),
    (dict(optim_in_backward=True, grad_clip=None, grad_accum_steps=2), "grad_accum_steps"),
    (dict(optim_in_backward=True, grad_clip=None, precision="fp16"), "precision"),
    (dict(attention="flash"), "attention"),
    (dict(precision="fp8"), "precision"),
    (dict(grad_accum_steps=0), "grad_accum_steps"),
])
def test_invalid_recipes_name_the_field(fields, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        Recipe(**fields)


def test_grad_accumulation_that_does_not_divide_the_batch_is_refused():
    with pytest.raises(ValueError, match="^grad_accum_steps:.*does not divide"):
        Recipe(grad_accum_steps=5).micro_batch(MODELS["cpu-small"])  # batch 12


@pytest.mark.parametrize("recipe", [Recipe(precision="tf32"), Recipe(precision="bf16", attention="flash")])
def test_recipes_the_cpu_cannot_run_are_refused_not_run_as_something_else(recipe):
    with pytest.raises(UnsupportedRecipe):
        check_runnable(recipe, "cpu")
    assert issubclass(UnsupportedRecipe, ValueError)


def test_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="choose from char, char-ctx2"):
        get_model("nope")
