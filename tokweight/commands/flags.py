"""Command-line flags generated from the config dataclasses: a flag names the dotted field it sets, and its type,
choices, shown default and help are read off the dataclass, so the CLI never holds a default of its own.

A command declares its flags as a table of ``Flag``s; ``options(cls, flags)`` adds them to a click command, its
help the field's docstring (the string literal under the field, read when the help is shown) unless the flag says
more. ``config_options(cls)`` adds ``--config FILE`` and ``--set group.field=value``; ``configured`` builds the
dataclass from the defaults, a preset, the file, the flags and ``--set``, each over the one before, and names a
missing required field by its flag.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class Flag:
    name: str
    """The option, e.g. "--k"; a boolean's on and off forms as "--progress/--no-progress"."""
    field: str
    """The dotted field it sets, e.g. "cvae.k"."""
    help: str = ""
    """What the command says of it; "": the field's docstring."""
    choices: tuple[str, ...] | None = None
    default: str | None = None
    """The default as shown, for a field whose default is resolved later (e.g. per latent); None: the
    dataclass's."""
    type: click.ParamType | None = None
    """A click type that checks the value (e.g. a path that must exist); None: the field's type."""
    multiple: bool = False
    """A tuple field given once per value (``--fingerprint A --fingerprint B``)."""

    @property
    def dest(self) -> str:
        return self.field.replace(".", "__")


def resolve(cls, dotted: str) -> tuple[type, dataclasses.Field]:
    """(the dataclass that owns the field, the field) of a dotted path from ``cls``."""
    *groups, name = dotted.split(".")
    for group in groups:
        cls = without_none(typing.get_type_hints(cls)[group])
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    if name not in by_name:
        raise KeyError(f"{dotted}: no such field of {cls.__name__}")
    return cls, by_name[name]


def without_none(hint):
    """``X | None`` -> X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def optional(cls, dotted: str) -> bool:
    """Whether a dotted field's type admits None (a field without a default is then None unless given)."""
    owner, f = resolve(cls, dotted)
    hint = typing.get_type_hints(owner)[f.name]
    return without_none(hint) is not hint


def default_of(cls, dotted: str):
    """The dataclass default of a dotted field (MISSING if it has none)."""
    _, f = resolve(cls, dotted)
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING


def field_type(cls, dotted: str):
    owner, f = resolve(cls, dotted)
    return without_none(typing.get_type_hints(owner)[f.name])


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """Field name -> the docstring after it in ``cls``'s body (a field without one is left out)."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: b.value.value for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}


def field_doc(cls, dotted: str) -> str:
    """The docstring of a dotted field, on one line ("" if it has none)."""
    owner, f = resolve(cls, dotted)
    return " ".join(field_docs(owner).get(f.name, "").split())


def shown(value) -> str:
    """A default as the command line takes it: a tuple comma-separated."""
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def shown_default(cls, flag: Flag, preset_kind: str | None = None) -> str | None:
    """The default a flag's help shows: the flag's own text, else the field's value under the default preset of
    ``preset_kind`` (None: the dataclass's)."""
    if flag.default is not None:
        return flag.default
    value = default_of(cls, flag.field)
    if preset_kind is not None:
        from tokweight.config_files import DEFAULT_PRESET, flat, preset

        value = flat(preset(preset_kind, DEFAULT_PRESET)).get(flag.field, value)
    return None if value is dataclasses.MISSING or value in (None, (), "") else shown(value)


def help_text(cls, flag: Flag, preset_kind: str | None = None) -> str:
    """The flag's help: its own or the field's docstring, then the default or [required]."""
    text = (flag.help or field_doc(cls, flag.field)) + (" Repeatable." if flag.multiple else "")
    if default_of(cls, flag.field) is dataclasses.MISSING and not optional(cls, flag.field):
        return f"{text}  [required]".strip()
    default = shown_default(cls, flag, preset_kind)
    return f"{text}  [default: {default}]".strip() if default not in (None, "None") else text


class FieldOption(click.Option):
    """An option whose help is composed when it is first read (``--help``), not when the command is imported."""

    def __init__(self, *args, help_of, **kwargs):
        self._help, self.help_of = None, help_of
        super().__init__(*args, **kwargs)

    @property
    def help(self) -> str:
        if self._help is None:
            self._help = self.help_of()
        return self._help

    @help.setter
    def help(self, value) -> None:
        self._help = value


def preset_option(kind: str, text: str):
    """``--preset NAME``: a file of tokweight/presets/<kind>/, the fields it changes; "default" unless given."""
    from tokweight.config_files import DEFAULT_PRESET, preset_names

    return click.option("--preset", type=click.Choice(preset_names(kind)), default=DEFAULT_PRESET, help=text)


def option(cls, flag: Flag, preset_kind: str | None = None):
    """The click option of one flag: default None (unset), the field's type or choices, its help read off the
    field when shown (its default under the default preset of ``preset_kind``, if the command takes presets)."""
    kind = field_type(cls, flag.field)
    common = dict(cls=FieldOption, help_of=lambda: help_text(cls, flag, preset_kind), default=None)
    if kind is bool:
        if "/" in flag.name:
            return click.option(flag.name, flag.dest, **common)
        return click.option(flag.name, flag.dest, is_flag=True, **common)
    if flag.multiple:
        kind = (typing.get_args(kind) or (str,))[0]
        common |= dict(multiple=True, default=())
    click_type = flag.type or (click.Choice(flag.choices) if flag.choices else {int: int, float: float}.get(kind, str))
    return click.option(flag.name, flag.dest, type=click_type, **common)


def options(cls, flags: tuple[Flag, ...], preset_kind: str | None = None):
    """Decorator: every flag's option, in table order."""
    def decorate(command):
        for flag in reversed(flags):
            command = option(cls, flag, preset_kind)(command)
        return command

    return decorate


def fields_set(flags: tuple[Flag, ...], kwargs: dict) -> dict[str, object]:
    """{dotted field: value} of the flags the user set (popped from ``kwargs``)."""
    values = {flag.field: kwargs.pop(flag.dest, None) for flag in flags}
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items() if v not in (None, ())}


def config_options(cls, example: str):
    """Decorator: ``--config FILE`` and ``--set group.field=value`` over the fields of ``cls`` (``example``: a
    --set of this command)."""
    name = cls.__name__
    config = click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), default=None,
                          help=f"A configuration file (TOML or JSON) of {name}'s fields: the defaults it changes. "
                               "Flags and --set override it.")
    sets = click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
                        help=f"Set any field of {name}, e.g. --set {example} (repeatable; the value a TOML literal; "
                             "docs/reference.md lists every field).")
    return lambda command: config(sets(command))


def configured(cls, flags: tuple[Flag, ...], kwargs: dict, config: str | None = None, sets=(),
               preset: dict | None = None, **given):
    """``cls`` from its defaults, then ``preset`` (a mapping of the fields it changes), then the ``config`` file,
    then ``given`` (dotted fields the command sets itself) and the flags the user set (popped from ``kwargs``),
    then every ``--set``. A required field that none of them gives is named by its flag."""
    from tokweight.config_files import assignment, build, flat, read, with_values

    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    start = {name: None for name in required if optional(cls, name)}  # None unless given
    start = with_values(start, flat(preset or {}))
    if config:
        start = with_values(start, flat(read(config)))
    obj = with_values(start, given | fields_set(flags, kwargs) | dict(assignment(item) for item in sets))
    missing = [name for name in required if name not in obj]
    if missing:
        names = [next((flag.name for flag in flags if flag.field == field), field) for field in missing]
        raise ValueError(f"missing {', '.join(names)}: give {'them' if len(names) > 1 else 'it'} on the command line "
                         "or in --config")
    return build(cls, obj)


def configured_run(run, cls, table: tuple[Flag, ...], flags: dict, config: str | None, sets: tuple[str, ...], threads,
                   errors: tuple[type[Exception], ...] = (ValueError,)):
    """``run`` on the ``cls`` the command line builds (``configured``), under ``threads``; any of ``errors`` as one
    line."""
    from tokweight.pipeline.threads import set_threads

    set_threads(threads)
    try:
        return run(configured(cls, table, flags, config, sets))
    except errors as e:
        raise click.ClickException(str(e)) from e
