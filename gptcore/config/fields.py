"""A case's configuration as flat, dotted fields (``recipe.kernels.loss``, as ``--set`` names a recipe's): what a
baseline entry keeps of the case it measured, so that a preset changed under the same name (a rung moved, a batch
refitted) is named, not read as a regression."""

from __future__ import annotations

import dataclasses
from typing import Any

from gptcore.config.model import GPTConfig
from gptcore.config.recipe import Recipe

Setup = dict[str, Any]
"""Dotted field name -> its value (JSON's types: a tuple becomes a list)."""


def flat(config: object, prefix: str = "") -> Setup:
    """Every field of the dataclass ``config``, a nested one's by its dotted name; a nested group itself by its
    class's name (None where the recipe leaves it out: ``recipe.parallel.ddp`` None or 'DDPOptions')."""
    out: Setup = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out[prefix + f.name] = type(value).__name__
            out.update(flat(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = list(value) if isinstance(value, tuple) else value
    return out


def setup_of(cfg: GPTConfig, recipe: Recipe) -> Setup:
    """The model (its batch as the case ran it: a fitted one included) and the recipe of one case."""
    return flat(cfg, "model.") | flat(recipe, "recipe.")


def defaults() -> Setup:
    """The fields that have a default (all of a Recipe's; a GPTConfig's optional ones), by their dotted names."""
    model = {
        f"model.{f.name}": f.default for f in dataclasses.fields(GPTConfig) if f.default is not dataclasses.MISSING
    }
    return model | flat(Recipe(), "recipe.")


def setup_differences(before: Setup, now: Setup) -> list[str]:
    """'recipe.fit_memory None -> 0.85' for each field whose value differs, in ``now``'s order. A field the entry
    does not have (added to the config since) is compared with its default, which is what the code did before it
    had the field; a field the config no longer has is not compared."""
    initial = defaults()
    changed = []
    for name, value in now.items():
        if name in before:
            old = before[name]
        elif name in initial:
            old = initial[name]
        else:
            continue
        if old != value:
            changed.append(f"{name} {old!r} -> {value!r}")
    return changed
