"""Operator identity: which aten operators a step ran in each phase, held exactly. The ledger's totals cannot see an
operator swapped for another at the same count (flash attention for efficient attention: 12 calls either way), so
each phase's operators are compared by name: one that appeared or vanished is named beside the one it replaced,
``aten._scaled_dot_product_flash_attention (12) -> aten._scaled_dot_product_efficient_attention (12)``. Between two
torch releases an operator can be renamed with nothing else changed (torch 2.15's ``fsdp.chunk_cat_mixed_dtype`` was
2.13's ``fsdp.chunk_cat``): there a swap at an equal count is the instrument's change, said and not failed, as
``gptcore.gate.checks.coverage_check`` says a change of torch's FLOP counter. The gate's check of it is
:func:`operator_checks`; ``compare`` prints the same lines (``gptcore.hunt.ledger``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gptcore.gate.checks import LEANER, REFRESH, Check
from gptcore.gate.rules import Status

if TYPE_CHECKING:
    from gptcore.measure.work import WorkLedger

OPERATORS = "operators"
"""The check of which operators ran in each phase."""
TORCH_LINE = "torch: this run "
"""How the line that names the run's torch and its baselines' begins (:func:`torch_line`)."""
RENAMED = "operators renamed"
"""The check that names operators renamed between the baseline's torch and the run's: news, never a failure."""


def release(version: str | None) -> str | None:
    """A torch version without its build: '2.15.0+cu132' -> '2.15.0'. Two builds of one release dispatch the same
    operators, so only another release can rename one."""
    return version.split("+", 1)[0] if version else None


def other_release(before: str | None, now: str | None) -> bool:
    """The run's torch is another release than the one its baseline was recorded under (False where either is
    unknown: a swap is then judged as a change of the code)."""
    return bool(before and now and release(before) != release(now))


def _name(op: str) -> str:
    return op.removesuffix(".default")


def _swap(a: str, n: int, b: str, m: int) -> str:
    return f"{_name(a)} ({n:,}) -> {_name(b)} ({m:,})"


@dataclass
class PhaseChanges:
    """What changed in the operators of one phase."""

    phase: str
    swapped: list[tuple[str, int, str, int]] = field(default_factory=list)
    """An operator that vanished, its count, the one that appeared in its place, its count (paired at equal counts
    first, then a lone pair whatever their counts)."""
    gone: list[tuple[str, int]] = field(default_factory=list)
    """Operators that vanished with nothing in their place."""
    new: list[tuple[str, int]] = field(default_factory=list)
    """Operators that appeared in place of nothing."""
    traded: list[tuple[str, int, int]] = field(default_factory=list)
    """Operators on both sides whose counts moved while the step's count held (before, now): a trade the totals
    cannot see."""

    def renames(self) -> list[tuple[str, int, str, int]]:
        """The swaps at an equal count: what a torch release that renamed an operator looks like."""
        return [s for s in self.swapped if s[1] == s[3]]

    def without_renames(self) -> PhaseChanges:
        return PhaseChanges(self.phase, [s for s in self.swapped if s[1] != s[3]], self.gone, self.new, self.traded)

    def __bool__(self) -> bool:
        return bool(self.swapped or self.gone or self.new or self.traded)

    @property
    def worse(self) -> bool:
        """Something ran that the baseline did not run, or ran more often: judged as a count above its baseline."""
        return bool(self.swapped or self.new or any(now > before for _, before, now in self.traded))

    def text(self) -> str:
        """'forward: aten.X (12) -> aten.Y (12), aten.Z (4) new' (the phase first, then each change)."""
        said = [_swap(*s) for s in self.swapped]
        said += [f"{_name(op)} ({n:,}) gone" for op, n in self.gone]
        said += [f"{_name(op)} ({n:,}) new" for op, n in self.new]
        said += [f"{_name(op)} {before:,} -> {now:,}" for op, before, now in self.traded]
        return f"{self.phase}: {', '.join(said)}"


def changes(now: dict[str, dict[str, int]] | None, before: dict[str, dict[str, int]] | None) -> list[PhaseChanges]:
    """Per phase, the operators that appeared or vanished (paired as swaps where they can be) and, where the step's
    count held, those whose counts traded (between operators, or an operator between phases); [] when either side
    has no per-operator counts (an entry recorded before the ledger kept them) or nothing changed. ``now`` and
    ``before`` map phase -> operator -> calls."""
    if now is None or before is None:
        return []
    found = []
    held = sum(sum(c.values()) for c in now.values()) == sum(sum(c.values()) for c in before.values())
    for phase in dict.fromkeys([*before, *now]):
        a = {op: n for op, n in before.get(phase, {}).items() if n}
        b = {op: n for op, n in now.get(phase, {}).items() if n}
        gone = sorted((op, a[op]) for op in a.keys() - b.keys())
        new = sorted((op, b[op]) for op in b.keys() - a.keys())
        swapped = []
        for op, n in list(gone):  # an equal count first: the likeliest replacement
            match = next((pair for pair in new if pair[1] == n), None)
            if match is not None:
                swapped.append((op, n, *match))
                gone.remove((op, n))
                new.remove(match)
        if len(gone) == 1 and len(new) == 1:  # one for one, at another count
            swapped.append((*gone.pop(), *new.pop()))
        traded = sorted((op, a[op], b[op]) for op in a.keys() & b.keys() if a[op] != b[op]) if held else []
        phase_changes = PhaseChanges(phase, swapped, gone, new, traded)
        if phase_changes:
            found.append(phase_changes)
    return found


def renamed_text(found: list[PhaseChanges], before_torch: str, now_torch: str) -> str | None:
    """'renamed between torch 2.13.0+cpu and 2.15.0+cu132: backward: fsdp.chunk_cat (5) -> fsdp.chunk_cat_mixed_dtype
    (5)' for the swaps at an equal count; None when there are none."""
    said = [f"{c.phase}: " + ", ".join(_swap(*s) for s in c.renames()) for c in found if c.renames()]
    return f"renamed between torch {before_torch} and {now_torch}: {'; '.join(said)}" if said else None


def split(
    found: list[PhaseChanges], before_torch: str | None, now_torch: str | None
) -> tuple[list[PhaseChanges], str | None]:
    """The changes to judge, and the line that names the renames between two torch releases (None on one release:
    every swap is then judged)."""
    if not other_release(before_torch, now_torch):
        return found, None
    judged = [c.without_renames() for c in found]
    return [c for c in judged if c], renamed_text(found, before_torch, now_torch)


def operator_checks(
    now: WorkLedger | None,
    before: WorkLedger | None,
    *,
    strict: bool = False,
    torches: tuple[str | None, str | None] = (None, None),
) -> list[Check]:
    """The operators of each phase against the baseline's, judged as the ledger's counts are: an operator that
    appeared (alone, or in place of another) or ran more often while the step's count held fails; one that vanished
    with nothing in its place passes with the refresh note, or under ``strict`` fails as leaner than the baseline.
    ``torches`` (the baseline's torch, the run's): between two releases a swap at an equal count is a rename, named
    in a check of its own that never fails. [] when nothing changed or either side has no per-operator counts."""
    if now is None or before is None:
        return []
    judged, renamed = split(changes(now.ops, before.ops), *torches)
    news = f"{renamed}; the operator's name changed, not the work"
    checks = [Check(RENAMED, None, None, None, Status.CHANGED, news)] if renamed else []
    if not judged:
        return checks
    said = "; ".join(c.text() for c in judged)
    if any(c.worse for c in judged):
        status, note = Status.FAIL, "an operator ran that the baseline's step did not, or more often: gated exactly"
    elif strict:
        status, note = Status.FAIL, f"{LEANER}: an operator the baseline ran is gone; {REFRESH}"
    else:
        status, note = Status.BETTER, "an operator the baseline ran is gone"
    return [*checks, Check(OPERATORS, None, None, None, status, note, moved=said)]


def cell(check: Check) -> str:
    """The end table's short form of an operator check: 'operators: 2 swapped', 'operators: 1 gone',
    'operators renamed (torch)'."""
    if check.metric == RENAMED:
        return "operators renamed (torch)"
    kinds = {" -> ": "swapped", ") gone": "gone", ") new": "new"}
    moved = check.moved or ""
    counted = [f"{moved.count(mark)} {word}" for mark, word in kinds.items() if mark in moved]
    return f"operators: {', '.join(counted) or 'counts traded'}"


def count_torches(torches: dict[tuple[str, str], int], before: str | None, now: str | None) -> None:
    """Count one case judged under torch ``now`` against an entry recorded under ``before`` in ``torches`` (the
    gate's), where the two differ."""
    if before and now and before != now:
        torches[before, now] = torches.get((before, now), 0) + 1


def torch_line(torches: dict[tuple[str, str], int]) -> str | None:
    """The line that names the baselines' torch and the run's where they differ (``torches``: (the baselines',
    the run's) -> how many cases were judged across them); None where they never did."""
    if not torches:
        return None
    said = []
    for now in dict.fromkeys(now for _, now in torches):  # one run, unless shards ran under several
        against = [f"{before} ({n} case{'s' if n > 1 else ''})" for (before, run), n in torches.items() if run == now]
        said.append(f"{now}, its baselines {', '.join(against)}")
    return (
        f"{TORCH_LINE}{'; this run '.join(said)}: an operator renamed between two releases is named, not failed; "
        "every count is held exactly as on one release"
    )
