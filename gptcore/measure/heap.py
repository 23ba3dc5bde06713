"""The Python heap kept out of the garbage collector's way. A benchmark process keeps torch, Dynamo and the suite
(about 300,000 objects) for its whole life. A full collection walks all of them (about 0.25 s on a 2-core AMD EPYC
family 25 model 1), and a session makes hundreds: each case's ``gc.collect`` and Python's own. What survived a
collection is frozen (``gc.freeze``): no later collection walks it. Nothing unreachable is frozen; an object frozen
while alive that later becomes cyclic garbage stays, so freeze only what lives as long as the process. The
benchmark plugin freezes once, after collection; the test suite also after any test that left the heap grown
(inductor's loaded kernels, about 80,000 objects a compiled case: ``refreeze_if_grown``)."""

from __future__ import annotations

import gc

REFREEZE_OBJECTS = 50_000
"""Objects the collector keeps for good (its oldest generation) beyond which they are frozen too."""


def freeze() -> None:
    """Collect, then take every object that survived out of all later collections."""
    gc.collect()
    gc.freeze()


def refreeze_if_grown(limit: int = REFREEZE_OBJECTS) -> bool:
    """Freeze again when the oldest generation holds more than ``limit`` objects; whether it did."""
    if len(gc.get_objects(generation=2)) <= limit:
        return False
    freeze()
    return True
