"""Byte sizes for people: the one place a number of bytes is turned into text (binary units, 1 KiB = 1024 B)."""

from __future__ import annotations

from collections.abc import Iterable

UNITS: dict[str, int] = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def unit_for(*sizes: float | None) -> str:
    """The largest unit in which the largest of ``sizes`` is at least 1 (B for zero or nothing)."""
    largest = max((abs(s) for s in sizes if s is not None), default=0)
    return next((u for u in reversed(UNITS) if largest >= UNITS[u]), "B")


def in_unit(nbytes: float, unit: str) -> float:
    """``nbytes`` expressed in ``unit`` (a key of UNITS)."""
    return nbytes / UNITS[unit]


def format_bytes(nbytes: float | None, unit: str | None = None, *, digits: int = 2) -> str:
    """'123.55 GiB', '35.70 MiB', '512 B'; ``unit`` fixes the unit (e.g. one unit for a whole table column),
    otherwise the largest that keeps the number >= 1. None formats as '—'."""
    if nbytes is None:
        return "—"
    unit = unit or unit_for(nbytes)
    if unit == "B":
        return f"{int(nbytes):,} B"
    return f"{in_unit(nbytes, unit):,.{digits}f} {unit}"


def common_unit(sizes: Iterable[float | None]) -> str:
    """One unit for a column of sizes: the one its largest entry reads best in."""
    return unit_for(*sizes)
