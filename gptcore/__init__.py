"""gptcore: a small, fast GPT and a training step in which every optimization is one recipe switch.

The names below are imported on first use, so that ``import gptcore`` (and ``python -m gptcore --help``) loads
no torch until a model or a Trainer is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from gptcore.config import GPTConfig, Recipe
from gptcore.presets import MODELS, RECIPES, get_model, get_recipe

_LAZY = {
    "GPT": "training.model",
    "Trainer": "training.trainer",
    "UnsupportedRecipe": "training.trainer",
    "check_runnable": "training.trainer",
    "resolve_device": "training.trainer",
}

__all__ = [
    "GPT",
    "GPTConfig",
    "MODELS",
    "RECIPES",
    "Recipe",
    "Trainer",
    "UnsupportedRecipe",
    "check_runnable",
    "get_model",
    "get_recipe",
    "resolve_device",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
