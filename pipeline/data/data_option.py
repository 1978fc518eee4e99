"""The ``--data`` option's type: a local dataset that must exist, or URLs (pipeline.data.urls) taken as given."""

from __future__ import annotations

from pathlib import Path

import click


class DataSource(click.ParamType):
    """A dataset folder (or a file listing shard URLs, one per line) that exists, or a URL pattern:
    ``https://host/d/{train,val}/shard-{000000..000009}.tar``, ``pipe:aws s3 cp s3://bucket/.../x.tar -``."""

    name = "data"

    def __init__(self, resolve: bool = False):
        self.resolve = resolve  # a local path as an absolute one (click.Path's resolve_path)

    def convert(self, value, param, ctx) -> str:
        from tokweight.store.manifest import is_url  # here: `--help` imports nothing heavy

        if is_url(str(value)):
            return str(value)
        path = Path(value)
        if not path.exists():
            self.fail(f"{str(value)!r} does not exist (nor is it an http(s):// or pipe: URL)", param, ctx)
        return str(path.resolve()) if self.resolve else str(value)
