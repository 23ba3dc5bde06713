"""Where the memory of a training step goes: tracked, estimated, simulated.

- ``categories``: the shared vocabulary (CATEGORIES, PeakReport, the breakdown of live bytes at one event).
- ``tracker``: LiveBytes, a storage tracker for real or fake tensors, and ``track_training``.
- ``analytic``: ``resolve`` (a model, a recipe and a device into a Question) and the analytic ``estimate``;
  its bookkeeping is in ``tally``, its op-by-op walk through the model in ``tally_forward`` and ``tally_backward``.
- ``simulation``: ``simulate``, two iterations of the real Trainer on fake tensors under the tracker.

``question = resolve(cfg, recipe, device="cpu")``, then ``estimate(question)`` (arithmetic) and
``simulate(question)``. The tracker and the simulation load torch on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gptcore.memory.analytic import Estimate, Question, estimate, resolve
from gptcore.memory.categories import CATEGORIES, PeakReport

if TYPE_CHECKING:
    from gptcore.memory.simulation import Simulation, simulate
    from gptcore.memory.tracker import LiveBytes, track_training

_LAZY = {"LiveBytes": "tracker", "track_training": "tracker", "Simulation": "simulation", "simulate": "simulation"}

__all__ = [
    "CATEGORIES",
    "Estimate",
    "LiveBytes",
    "PeakReport",
    "Question",
    "Simulation",
    "estimate",
    "resolve",
    "simulate",
    "track_training",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
