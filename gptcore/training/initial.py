"""A model's initial weights: drawn on the CPU from the recipe's seed, and drawn once where a process builds the same
model again and again.

The weights are drawn on the CPU so that every device starts from the same bits (what the CUDA generator draws depends
on the device's launch configuration). The CPU generator is serial: deep-1.6b's 1.7 billion weights took 40.2 s to draw
on a 2-core AMD EPYC family 25 model 1, where its steps on an H200 take 0.07 to 0.6 s each, and a study builds the same
model under each of its recipes. So a model built for a GPU keeps its drawn weights, with the generator's state after
them; the next model of the same draw (the same model configuration, seed, and parameter names, shapes and ties) is
handed those weights instead of drawing them again, and the generator is left where drawing would have left it: the same
bits, to the last one (2.1 to 2.4 s for deep-1.6b on the same CPU). One draw is kept at a time (a study's cases are
ordered model by model), and none by default on the CPU: a float32 model there is the drawn tensors themselves, which
training changes in place, and a CPU's models are small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from gptcore.config import GPTConfig, Recipe
from gptcore.training.model import GPT

#: A model's structure as drawing sees it: each parameter's and buffer's name, shape and dtype, and for a parameter
#: the index of the first name that holds the same tensor (a tied weight names it twice).
Signature = tuple[tuple[str, tuple[int, ...], torch.dtype, int | None], ...]


@dataclass(frozen=True)
class Kept:
    """One draw: what it was drawn for, every parameter and buffer by name (a tied weight once per name, one
    tensor), and the CPU generator's state after it."""

    key: tuple[GPTConfig, int, Signature]
    tensors: dict[str, torch.Tensor]
    rng: torch.Tensor


_kept: Kept | None = None


def initial_model(
    cfg: GPTConfig,
    recipe: Recipe,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    keep: bool | None = None,
) -> GPT:
    """``GPT(cfg, recipe)`` with its weights drawn from ``recipe.seed`` on the CPU (every generator seeded), on
    ``device`` in ``dtype``. ``keep`` (by default: where ``device`` is not the CPU) keeps this draw for the next
    model of the same draw, and takes the kept one when it is that draw; it needs a model that is a copy of the drawn
    tensors, so not a float32 model on the CPU."""
    global _kept
    device = torch.device(device)
    keep = device.type != "cpu" if keep is None else keep
    if keep and device.type == "cpu" and dtype == torch.float32:
        raise ValueError("keep: a float32 model on the CPU is the drawn tensors themselves; nothing can be kept")
    torch.manual_seed(recipe.seed)
    if keep:
        with torch.device("meta"):  # the structure alone: nothing is drawn, nothing is allocated
            model = GPT(cfg, recipe)
        key = (cfg, recipe.seed, signature(model))
        if _kept is not None and _kept.key == key:
            adopt(model, _kept.tensors)
            torch.set_rng_state(_kept.rng)
            return model.to(device=device, dtype=dtype)
        _kept = None  # the last draw is let go before this one is made: one draw is held at a time
    model = GPT(cfg, recipe)
    if keep:
        _kept = Kept(key, tensors(model), torch.get_rng_state())
    return model.to(device=device, dtype=dtype)


def forget() -> None:
    """Let go of the kept draw."""
    global _kept
    _kept = None


def signature(model: nn.Module) -> Signature:
    """Each parameter's and buffer's name, shape, dtype and, for a parameter, the first name holding its tensor."""
    first: dict[int, int] = {}
    out = []
    for i, (name, p) in enumerate(model.named_parameters(remove_duplicate=False)):
        out.append((name, tuple(p.shape), p.dtype, first.setdefault(id(p), i)))
    for name, b in model.named_buffers(remove_duplicate=False):
        out.append((name, tuple(b.shape), b.dtype, None))
    return tuple(out)


def tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, detached (a tied weight: one tensor under each of its names)."""
    detached: dict[int, torch.Tensor] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {name: detached.setdefault(id(t), t.detach()) for name, t in named}


def adopt(model: nn.Module, kept: dict[str, torch.Tensor]) -> None:
    """Give ``model`` (its structure on the meta device) the kept tensors by name: one Parameter for each kept
    tensor, so a tied weight stays one parameter."""
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    made: dict[int, nn.Parameter] = {}
    for name, t in kept.items():
        owner, _, leaf = name.rpartition(".")
        module = model.get_submodule(owner)
        if name in params:
            if id(t) not in made:
                made[id(t)] = nn.Parameter(t)
            setattr(module, leaf, made[id(t)])
        else:
            setattr(module, leaf, t)
