"""``--set FIELD=VALUE``: one Recipe field changed on top of a named recipe, a nested config's field by its dotted
name (``parallel.fsdp2.reshard_after_forward=false``), each value converted to the field's annotated type. The CLI
takes it for ``train`` and ``estimate``; the Recipe validates what results."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Sequence

from gptcore.config import Recipe


class OverrideError(ValueError):
    """An assignment that names no field or whose value the field cannot take: one line."""


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _types_of(hint: object) -> tuple:
    """The types an annotation allows: ``X | None`` -> (X, NoneType); any other -> (hint,)."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _group(hint: object) -> type | None:
    """The nested config (a dataclass) a field holds, None-able or not (Recipe.parallel, Parallel.ddp); None for a
    plain value."""
    return next((o for o in _types_of(hint) if dataclasses.is_dataclass(o)), None)


def _names(cls: type, prefix: str = "") -> list[str]:
    """Every FIELD --set takes under ``cls``: its fields, and the nested configs' fields by their dotted names."""
    names = []
    for name, hint in typing.get_type_hints(cls).items():
        names.append(prefix + name)
        if (group := _group(hint)) is not None:
            names += _names(group, f"{prefix}{name}.")
    return names


def _convert(field: str, text: str, hint: object) -> object:
    """``text`` as a value of the annotated type ``hint`` (bool, int, float, a Literal of names, or None-able; a
    None-able nested config is switched on with its defaults by true, off by false or None)."""
    options = _types_of(hint)
    group = _group(hint)
    if group is not None and type(None) not in options:
        names = ", ".join(f"{field}.{f.name}" for f in dataclasses.fields(group))
        raise OverrideError(f"--set {field}={text}: {field} is a group of fields; set {names}")
    if type(None) in options and text.lower() in ("none", "null"):
        return None
    for option in options:
        if option is bool or option is group:
            if text.lower() in _TRUE + _FALSE:
                on = text.lower() in _TRUE
                return on if option is bool else option() if on else None
        elif option in (int, float):
            try:
                return option(text)
            except ValueError:
                pass
        elif typing.get_origin(option) is typing.Literal or option is str:
            return text  # the Recipe checks the name
    kinds = " or ".join(
        "true/false" if o is bool or o is group else "None" if o is type(None) else getattr(o, "__name__", "a name")
        for o in options
    )
    raise OverrideError(f"--set {field}={text}: expected {kinds}")


def _replaced(config: object, cls: type, changes: dict[str, object]) -> object:
    """``config`` (None: ``cls`` with its defaults) with ``changes`` applied: a value per field, or for a nested
    config a dict of its own changes."""
    base = config if config is not None else cls()
    hints = typing.get_type_hints(cls)
    return dataclasses.replace(
        base,
        **{
            name: _replaced(getattr(base, name), _group(hints[name]), change) if isinstance(change, dict) else change
            for name, change in changes.items()
        },
    )


def _not_a_field(field: str) -> OverrideError:
    close = difflib.get_close_matches(field, _names(Recipe), n=1)
    return OverrideError(f"--set {field}: not a Recipe field" + (f"; did you mean {close[0]!r}?" if close else ""))


def apply_assignments(recipe: Recipe, assignments: Sequence[str]) -> Recipe:
    """``recipe`` with each FIELD=VALUE applied, a nested config's field by its dotted name
    (``parallel.fsdp2.reshard_after_forward=false``); the Recipe validates the result (ValueError naming the
    field)."""
    changes: dict[str, object] = {}  # field -> value; nested config -> {its field -> value, ...}
    for item in assignments:
        field, sep, text = item.partition("=")
        field = field.strip()
        if not sep:
            raise OverrideError(f"--set {item}: expected FIELD=VALUE")
        *path, last = field.split(".")
        cls, node = Recipe, changes
        for name in path:  # down to the nested config that holds ``last``
            group = _group(typing.get_type_hints(cls).get(name))
            if group is None:
                raise _not_a_field(field)
            if not isinstance(node.get(name, {}), dict):  # switched on or off earlier: go on from its fields
                value = node[name] if node[name] is not None else group()
                node[name] = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            cls, node = group, node.setdefault(name, {})
        hints = typing.get_type_hints(cls)
        if last not in hints:
            raise _not_a_field(field)
        node[last] = _convert(field, text.strip(), hints[last])
    return _replaced(recipe, Recipe, changes) if changes else recipe
