"""gptcore: a small, fast GPT and a training step in which every optimization is one recipe switch."""

from .config import MODELS, RECIPES, GPTConfig, Recipe, get_model, get_recipe
from .model import GPT
from .train import Trainer, UnsupportedRecipe, check_runnable, resolve_device

__all__ = ["GPT", "GPTConfig", "MODELS", "RECIPES", "Recipe", "Trainer", "UnsupportedRecipe", "check_runnable",
           "get_model", "get_recipe", "resolve_device"]
