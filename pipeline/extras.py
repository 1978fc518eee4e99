"""Optional packages (the ``[hf]`` and ``[lora]`` extras): importing one, or one line naming the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

import click


class MissingExtra(click.ClickException, ImportError):
    """An optional package is not installed: an ImportError to callers, one line on the CLI."""


def require(module: str, extra: str, needed_by: str) -> ModuleType:
    """``module`` imported, or MissingExtra: "<needed_by> needs the <module> package: pip install 'tokweight[extra]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(f"{needed_by} needs the {module} package: pip install 'tokweight[{extra}]'") from e
