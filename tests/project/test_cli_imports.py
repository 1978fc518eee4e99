"""`tokweight --help` and every `tokweight CMD --help` import no torch, numpy or pyarrow: each command builds its
options from config modules that import only the standard library, and imports its heavy modules when it runs.

Each check runs in a fresh interpreter, which invokes the click group with --help and then lists the heavy modules
that sys.modules holds."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from tokweight.cli import main

HEAVY = ("torch", "numpy", "pyarrow")
CHECK = """
import json, sys
from tokweight.cli import main
try:
    main(sys.argv[1:] + ["--help"], prog_name="tokweight", standalone_mode=False)
except SystemExit:
    pass
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))
"""


def command_words(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's words under ``group``, subcommands included."""
    out = []
    for name, command in sorted(group.commands.items()):
        out.append(prefix + (name,))
        if isinstance(command, click.Group):
            out += command_words(command, prefix + (name,))
    return out


def heavy_after_help(words: tuple[str, ...]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHECK.format(heavy=HEAVY), *words], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("words", [(), *command_words(main)], ids=lambda w: " ".join(w) or "tokweight")
def test_help_imports_no_torch_numpy_or_pyarrow(words):
    assert heavy_after_help(words) == [], f"tokweight {' '.join(words)} --help imported them"


def test_the_check_sees_a_heavy_import():
    code = CHECK.replace("from tokweight.cli import main", "import numpy\nfrom tokweight.cli import main")
    done = subprocess.run([sys.executable, "-c", code.format(heavy=HEAVY)], capture_output=True, text=True)
    assert "numpy" in json.loads(done.stdout.strip().splitlines()[-1])
