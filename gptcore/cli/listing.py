"""``list``: every model and recipe, one line each."""

from __future__ import annotations

import argparse

from gptcore.presets import MODEL_NOTES, MODELS, RECIPE_NOTES, RECIPES

NAME = "list"
HELP = "every model and recipe, one line each"


def setup_arguments(parser: argparse.ArgumentParser) -> None:
    """list takes no arguments."""


def run(_: argparse.Namespace) -> int:
    from tabulate import tabulate

    print(tabulate([(name, MODEL_NOTES[name]) for name in MODELS], headers=["model", "what"]))
    print()
    print(tabulate([(name, RECIPE_NOTES[name]) for name in RECIPES], headers=["recipe", "what"]))
    return 0
