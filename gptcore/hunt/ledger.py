"""What moved between two work ledgers, as ``compare`` prints it: every count that differs, the operators that
moved a total, and the operators swapped in a phase at an equal count, which no total shows (named as the gate names
them, ``gptcore.gate.operators``). The ledgers are the driver's JSON (``gptcore.hunt.driver``), nested dicts of
ints, so that a revision from before any of these modules compares too."""

from __future__ import annotations

from gptcore.gate import operators
from gptcore.gate.checks import moved_ops

BY_OP = ("ops", "allocations_by_op", "flops_by_op")
"""The ledger's per-operator counts: not listed count by count, but named where a total moved."""


def ledger_changes(
    a: dict | None, b: dict | None, prefix: str = "", torches: tuple[str | None, str | None] = (None, None)
) -> list[str] | None:
    """Every count of two work ledgers (nested dicts of ints) that differs, 'op_calls.backward 250 -> 262 (+12)',
    then the operators that moved them, 'op calls by operator: aten.detach +4, aten.alias +4' (largest first; or
    'operators not recorded' where a revision's ledger has none), then the operators that appeared or vanished in
    a phase, 'operators: forward: aten.X (12) -> aten.Y (12)' (:func:`operator_lines`); None when either ledger is
    missing. ``torches``: A's torch and B's."""
    if a is None or b is None:
        return None
    changes = _count_changes(
        {k: v for k, v in a.items() if k not in BY_OP}, {k: v for k, v in b.items() if k not in BY_OP}, prefix
    )
    for total, key, what in (
        ("op_calls", "ops", "op calls"),
        ("allocations", "allocations_by_op", "allocations"),
        ("flops", "flops_by_op", "flops"),
    ):
        if a.get(total) != b.get(total):
            by_op = [_summed(x.get(key)) for x in (a, b)]
            named = moved_ops(by_op[1], by_op[0])
            if named:
                changes.append(f"{what} by operator: {named}")
    return changes + operator_lines(a.get("ops"), b.get("ops"), torches)


def operator_lines(a: dict | None, b: dict | None, torches: tuple[str | None, str | None] = (None, None)) -> list[str]:
    """The operators of B's phases against A's, as the gate names them (gptcore.gate.operators): 'operators:
    forward: aten._scaled_dot_product_flash_attention (12) -> aten._scaled_dot_product_efficient_attention (12)';
    between two torch releases a swap at an equal count is 'operators renamed between torch X and Y: ...'."""
    judged, renamed = operators.split(operators.changes(b, a), *torches)
    lines = [f"operators {renamed}"] if renamed else []
    return lines + ([f"operators: {'; '.join(c.text() for c in judged)}"] if judged else [])


def _summed(counts: dict | None) -> dict[str, int] | None:
    """Per-operator counts, summed over phases where they are kept per phase."""
    if counts is None or not any(isinstance(v, dict) for v in counts.values()):
        return counts
    total: dict[str, int] = {}
    for phase in counts.values():
        for op, n in phase.items():
            total[op] = total.get(op, 0) + n
    return total


def _count_changes(a: dict, b: dict, prefix: str = "") -> list[str]:
    changes = []
    for key in dict.fromkeys([*a, *b]):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) or isinstance(y, dict):
            changes += _count_changes(x or {}, y or {}, f"{prefix}{key}.")
        elif x != y:
            delta = f" ({y - x:+,})" if isinstance(x, int) and isinstance(y, int) else ""
            changes.append(
                f"{prefix}{key} {x if x is None else format(x, ',')} -> {y if y is None else format(y, ',')}{delta}"
            )
    return changes
