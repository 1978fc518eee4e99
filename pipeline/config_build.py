"""Config dataclasses from plain data and back: the one builder every configuration goes through (a config file, a
run's config.json, the command line's flags, a preset). Standard library only, so a config module may import it
(``tests/training/config/test_config_modules.py``).

``build(cls, mapping)`` makes the dataclass ``cls`` from a nested mapping of its fields (nested dataclasses from
mappings, tuples from lists) and refuses a field ``cls`` does not have by its dotted name; ``plain`` is the
way back (dataclasses as mappings, tuples as lists); ``defaults`` the fields of ``cls`` that have a default.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any


def defaults(cls) -> dict:
    """The fields of ``cls`` that have a default, as plain data (a nested dataclass as its mapping)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return plain(out)


def plain(obj) -> Any:
    """Dataclasses as mappings and tuples as lists: ``build``'s input (``build`` turns them back)."""
    def encode(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        raise TypeError(f"{type(value).__name__} is not configuration data")

    return json.loads(json.dumps(obj, default=encode))


def build(cls, data: dict, where: str = ""):
    """The dataclass ``cls`` from a mapping of its fields (nested dataclasses from mappings, tuples from lists);
    a field ``cls`` does not have is refused by its dotted name."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or cls.__name__} is a group of fields {field_names(cls)}, not {data!r}")
    unknown = sorted(set(data) - set(field_names(cls)))
    if unknown:
        raise ValueError(f"{', '.join(where + k for k in unknown)}: no such field; {where.rstrip('.') or cls.__name__} "
                         f"has {field_names(cls)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: converted(hints[k], v, f"{where}{k}") for k, v in data.items()})


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def converted(hint, value, where: str):
    """``value`` as the type ``hint`` wants it: a dataclass from a mapping, a tuple from a list."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    for option in options:
        if dataclasses.is_dataclass(option) and isinstance(value, dict):
            return build(option, value, f"{where}.")
        origin = typing.get_origin(option)
        if origin is tuple and isinstance(value, (list, tuple)):
            args = typing.get_args(option)
            inner = args[0] if args else Any
            return tuple(converted(inner, v, where) for v in value)
    return value
