"""A baseline entry keeps the setup it measured (gptcore.config.fields: the case's model and recipe as flat fields),
and an entry of another setup is no baseline for the case: a preset changed under the same name (the ladder's
ladder-9 was liger's loss at B=16 and is now nanoGPT's step at the fitted batch) is named field by field, and
nothing is compared, where the figures alone would read as a regression (+800% peak). Each change is planted in a
copy of a recorded entry, never in gptcore."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from gptcore.config import setup_differences, setup_of
from gptcore.gate import baselines, verdicts
from gptcore.gate.checks import NO_BASELINE
from gptcore.gate.schema import BaselineError, Entry, Tolerances
from gptcore.presets import MODELS, RECIPES
from tests.test_gate import CASE_GLOB, entry, recorded, run  # noqa: F401 (fixtures)

pytestmark = pytest.mark.cpu

GPT2 = MODELS["gpt2"]
LADDER_8 = setup_of(GPT2, RECIPES["ladder-8"])
FITTED = setup_of(dataclasses.replace(GPT2, batch_size=146), RECIPES["ladder-9"])  # ladder-9 as an H200 fits it


def figures(peak: int, setup: dict | None) -> Entry:
    return Entry(
        tokens_per_s=400_000.0,
        tokens_per_s_iqr=1_000.0,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=None,
        loss=10.9,
        loss_step=20,
        precision="bf16",
        setup=setup,
    )


def test_a_setup_is_every_field_of_the_model_and_the_recipe_by_its_dotted_name():
    assert LADDER_8["model.batch_size"] == 16 and LADDER_8["model.n_layer"] == 12
    assert LADDER_8["recipe.kernels.loss"] == "torch" and LADDER_8["recipe.compile_mode"] == "default"
    assert LADDER_8["recipe.parallel.ddp"] is None  # a group the recipe leaves out; one it has, by its class's name
    ddp = setup_of(MODELS["cpu-small"], RECIPES["ddp"])
    assert ddp["recipe.parallel.ddp"] == "DDPOptions" and "recipe.parallel.ddp.gradient_as_bucket_view" in ddp
    assert setup_differences(setup_of(MODELS["cpu-small"], RECIPES["fp32"]), ddp)[0] == (
        "recipe.parallel.ddp None -> 'DDPOptions'"
    )
    every = [setup_of(MODELS[m], RECIPES[r]) for m in MODELS for r in RECIPES]  # every preset a case can name
    assert json.loads(json.dumps(every)) == every  # JSON's types, so that a baseline file holds each one exactly


def test_the_differences_name_each_changed_field_and_a_new_field_is_held_to_its_default():
    assert setup_differences(LADDER_8, LADDER_8) == []
    assert setup_differences(LADDER_8, FITTED) == ["model.batch_size 16 -> 146", "recipe.fit_memory None -> 0.85"]
    older = {k: v for k, v in LADDER_8.items() if k != "recipe.fit_memory"}  # recorded before the field existed
    assert setup_differences(older, LADDER_8) == []  # the default: what the code did before it had the field
    assert setup_differences(older, FITTED) == ["model.batch_size 16 -> 146", "recipe.fit_memory None -> 0.85"]
    removed = LADDER_8 | {"recipe.gone": True}  # a field the config no longer has: not compared
    assert setup_differences(removed, LADDER_8) == []


def test_an_entry_of_another_setup_is_no_baseline_and_the_verdict_names_the_fields():
    tol = Tolerances.default_for("cuda")
    moved = verdicts.verdict_of(
        "test_ladder[gpt2-ladder-9]", figures(9 * 10**10, FITTED), figures(10**10, LADDER_8), tol
    )
    assert moved.missing and not moved.failed  # a peak 9x the entry's is not judged against another setup
    assert {c.status for c in moved.checks} == {NO_BASELINE}
    why = "its entry measured another setup: model.batch_size 16 -> 146; recipe.fit_memory None -> 0.85"
    assert moved.summary() == f"no baseline ({why})" and moved.missing_why == f" ({why})"
    same = verdicts.verdict_of("case", figures(10**10, LADDER_8), figures(10**10, LADDER_8), tol)
    assert not same.missing and same.summary() == "ok"
    older = verdicts.verdict_of("case", figures(9 * 10**10, LADDER_8), figures(10**10, None), tol)  # no setup kept
    assert not older.missing and older.failed[0].metric == "peak memory"  # judged as before setups were kept


def test_a_malformed_setup_is_one_clear_error(tmp_path):
    path = tmp_path / "cpu.json"
    baselines.update(path, "cpu", {"a": figures(1, LADDER_8)}, device_name="AMD EPYC", device_type="cpu")
    assert baselines.load(path, "cpu").entries["a"].setup == LADDER_8  # kept exactly
    data = json.loads(path.read_text())
    data["benchmarks"]["a"]["setup"] = {"recipe.lr": {"nested": 1}}
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=r"setup: expected an object of field -> value"):
        baselines.load(path, "cpu")


def test_no_loss_reference_is_added_to_an_entry_of_another_setup(tmp_path):
    path = tmp_path / "cpu.json"
    recorded_entry = dataclasses.replace(figures(1, LADDER_8), cpu_model="Intel(R) Xeon(R) Processor")
    baselines.update(path, "cpu", {"a": recorded_entry}, device_name="Intel(R) Xeon(R) Processor", device_type="cpu")
    other = dataclasses.replace(figures(1, FITTED), cpu_model="AMD EPYC")
    assert baselines.add_loss_references(path, "cpu", {"a": other}) == (0, ["a"])
    same = dataclasses.replace(figures(1, LADDER_8), cpu_model="AMD EPYC")
    assert baselines.add_loss_references(path, "cpu", {"a": same}) == (1, [])


def test_a_real_case_against_a_copy_of_another_setup_is_no_baseline_naming_the_field(
    run,  # noqa: F811
    recorded: dict,  # noqa: F811
) -> None:
    """The planted change: the recorded entry's recipe.lr doubled, as if the preset's lr had changed since."""
    kept = entry(recorded)["setup"]
    assert kept == setup_of(MODELS["cpu-small"], RECIPES["ckpt-fp32"])  # recorded with the case's own setup
    planted = copy.deepcopy(recorded)
    lr = kept["recipe.lr"]
    entry(planted)["setup"]["recipe.lr"] = 2 * lr
    change = f"its entry measured another setup: recipe.lr {2 * lr!r} -> {lr!r}"
    strict = run(planted, "--baseline-strict")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines([f"*{CASE_GLOB}: no baseline for cpu ({change}); record it with: *"])
    lenient = run(planted)
    lenient.assert_outcomes(passed=1)
    lenient.stdout.fnmatch_lines([f"*no baseline ({change})*"])
    del entry(planted)["setup"]  # an entry recorded before setups were kept: judged as before
    run(planted, "--baseline-strict").assert_outcomes(passed=1)
