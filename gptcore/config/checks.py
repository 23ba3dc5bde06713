"""What every configuration type checks with: a field's ValueError that names it, counts, a list of choices."""

from __future__ import annotations


def check(ok: bool, field: str, message: str) -> None:
    """ValueError ``'field: message'`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{field}: {message}")


def check_counts(obj: object, *names: str) -> None:
    """Each named field is an integer >= 1."""
    for name in names:
        value = getattr(obj, name)
        check(isinstance(value, int) and value >= 1, name, f"must be an integer >= 1, got {value!r}")


def choose(names: tuple[str, ...]) -> str:
    """``names`` as a message lists them: 'a, b or c'."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
