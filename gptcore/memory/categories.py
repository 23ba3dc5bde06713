"""The vocabulary that the tracker, the simulation and the estimate share: the categories of live memory, the
record of one tracked storage, the peak report, and the breakdown of live bytes by category at one event.

Categories: parameters, buffers, gradients (tensors that become ``.grad``, from their birth), optimizer state,
weight copies (autocast's low-precision copies of weights and biases), activations (allocated by the forward up
to the lm_head), logits and loss (the lm_head on), recomputed activations (checkpointing's, in backward), backward
temporaries, optimizer temporaries (AdamW's 0-dim step counts land here), other (the step's token ids, scalars).
Two more come from the CPU allocator's count (``allocator``), where the tracker cannot see: untracked (the bytes
it counted at an eager step's peak beyond the tracker's: a kernel's scratch, Python numbers autograd keeps) and
compiled step (everything a compiled step holds beyond its parameters and buffers).
No torch here: the estimate is arithmetic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

CATEGORIES: tuple[str, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "weight copies",
    "activations",
    "logits and loss",
    "recomputed activations",
    "backward temporaries",
    "optimizer temporaries",
    "other",
    "untracked",
    "compiled step",
)

(
    PARAMETERS,
    BUFFERS,
    GRADIENTS,
    OPTIMIZER_STATE,
    WEIGHT_COPIES,
    ACTIVATIONS,
    LOGITS_AND_LOSS,
    RECOMPUTED,
    BACKWARD_TEMPORARIES,
    OPTIMIZER_TEMPORARIES,
    OTHER,
    UNTRACKED,
    COMPILED_STEP,
) = CATEGORIES

#: what an untagged new storage is, by the phase that allocated it
PHASE_CATEGORY: dict[str, str] = {
    "forward": ACTIVATIONS,
    "backward": BACKWARD_TEMPORARIES,
    "optimizer": OPTIMIZER_TEMPORARIES,
}


@dataclass
class StorageRecord:
    """One tracked storage: its size, its category, and the events of its birth and death (None while live)."""

    nbytes: int
    category: str
    born: int
    died: int | None = None


@dataclass
class PeakReport:
    """The peak of live storage bytes, the phase and step it happened in, and its breakdown by category."""

    peak_bytes: int
    phase: str
    step: int
    by_category: dict[str, int] = field(default_factory=dict)


def ordered(by_category: dict[str, int]) -> dict[str, int]:
    """The non-zero entries of ``by_category``, in the order of CATEGORIES."""
    return {c: by_category[c] for c in CATEGORIES if by_category.get(c)}


def breakdown(records: Iterable[StorageRecord], event: int) -> dict[str, int]:
    """Live bytes per category just after ``event`` (born at or before it, not dead by then), ordered."""
    live: Counter[str] = Counter()
    for record in records:
        if record.born <= event and (record.died is None or record.died > event):
            live[record.category] += record.nbytes
    return ordered(live)
