"""gptcore.measure.heap: a freeze collects first (nothing unreachable is kept) and takes what lives out of every later
collection; it freezes again only beyond its limit; a benchmark session freezes in a process of its own, never inside
another's."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from gptcore.measure import heap
from tests.helpers import run_pytest

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[1]


class Node:
    """A Python object the collector tracks, to make cycles of."""


def test_a_freeze_collects_the_garbage_first_and_takes_what_lives_out_of_every_collection():
    dead, alive = Node(), Node()
    dead.me, alive.me = dead, alive  # two cycles: only a collection frees one
    gone = weakref.ref(dead)
    del dead
    before = gc.get_freeze_count()
    heap.freeze()
    assert gone() is None  # collected, not frozen
    assert gc.get_freeze_count() > before
    assert not any(o is alive for o in gc.get_objects())  # in no generation: no collection walks it


def test_it_freezes_again_only_when_the_oldest_generation_holds_more_than_the_limit():
    heap.freeze()
    kept = [Node() for _ in range(1_000)]
    gc.collect()  # survivors of a full collection land in the oldest generation
    assert len(gc.get_objects(generation=2)) >= len(kept)
    assert heap.refreeze_if_grown(limit=10 * len(kept)) is False
    assert heap.refreeze_if_grown(limit=len(kept) // 2) is True
    assert len(gc.get_objects(generation=2)) < len(kept) // 2


@pytest.mark.parametrize("frozen_before", [0, 1])
def test_a_session_freezes_in_a_process_of_its_own_and_never_inside_anothers(tmp_path, monkeypatch, frozen_before):
    """A run inside a process that froze already (a test's) must not freeze: its own session's objects would be
    kept after it ends."""
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    calls = []
    monkeypatch.setattr(heap, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "get_freeze_count", lambda: frozen_before)
    run_pytest(tmp_path, "-p", "no:cacheprovider", "--import-mode=importlib", str(tmp_path)).assert_outcomes(passed=1)
    assert calls == ([] if frozen_before else ["freeze"])  # once, before the first case
