"""Command-line flags generated from the config dataclasses: a flag names the dotted field it sets, and its type,
choices and shown default are read off the dataclass, so the CLI never holds a default of its own.

A command declares its flags as a table of ``Flag``s; ``options(cls, flags)`` adds them to a click command,
``fields_set(flags, kwargs)`` returns the dotted fields the user set. Every field a flag does not reach is still
reachable with ``--set group.field=value`` where a command takes it (`tokweight train`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Flag:
    name: str
    """The option, e.g. "--k"."""
    field: str
    """The dotted field it sets, e.g. "cvae.k"."""
    help: str = ""
    choices: tuple[str, ...] | None = None
    default: str | None = None
    """The default as shown, for a field whose default is resolved later (e.g. per latent); None: the
    dataclass's."""
    type: click.ParamType | None = None
    """A click type that checks the value (e.g. a path that must exist); None: the field's type."""

    @property
    def dest(self) -> str:
        return self.field.replace(".", "__")


def resolve(cls, dotted: str) -> tuple[type, dataclasses.Field]:
    """(the dataclass that owns the field, the field) of a dotted path from ``cls``."""
    *groups, name = dotted.split(".")
    for group in groups:
        cls = plain(typing.get_type_hints(cls)[group])
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    if name not in by_name:
        raise KeyError(f"{dotted}: no such field of {cls.__name__}")
    return cls, by_name[name]


def plain(hint):
    """``X | None`` -> X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def default_of(cls, dotted: str):
    """The dataclass default of a dotted field (MISSING if it has none)."""
    _, f = resolve(cls, dotted)
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def field_type(cls, dotted: str):
    owner, f = resolve(cls, dotted)
    return plain(typing.get_type_hints(owner)[f.name])


def shown_default(cls, flag: Flag) -> str | None:
    if flag.default is not None:
        return flag.default
    value = default_of(cls, flag.field)
    return None if value is dataclasses.MISSING else str(value)


def option(cls, flag: Flag):
    """The click option of one flag: default None (unset), the field's type or choices, its default in the help."""
    kind = field_type(cls, flag.field)
    default = shown_default(cls, flag)
    text = f"{flag.help}  [default: {default}]".strip() if default not in (None, "None") else flag.help
    if kind is bool:
        return click.option(flag.name, flag.dest, is_flag=True, default=None, help=text)
    click_type = flag.type or (click.Choice(flag.choices) if flag.choices else {int: int, float: float}.get(kind, str))
    return click.option(flag.name, flag.dest, type=click_type, default=None, help=text)


def options(cls, flags: tuple[Flag, ...]):
    """Decorator: every flag's option, in table order."""
    def decorate(command):
        for flag in reversed(flags):
            command = option(cls, flag)(command)
        return command

    return decorate


def fields_set(flags: tuple[Flag, ...], kwargs: dict) -> dict[str, object]:
    """{dotted field: value} of the flags the user set (popped from ``kwargs``)."""
    values = {flag.field: kwargs.pop(flag.dest, None) for flag in flags}
    return {k: v for k, v in values.items() if v is not None}
