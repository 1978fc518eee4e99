"""Docs that are true: the command reference is the CLI's own --help, and every `tokweight CMD --flag` the README
and docs/ write exists. docs/history/ is a dated record of superseded studies, written with the commands of
its day: the reference does not depend on it, and it is not checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tokweight.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]  # cli.md: the CLI itself
COMMAND = re.compile(r"tokweight ((?:store )?[a-z][a-z-]*)((?: +[^`|;&#]*)?)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def spans(text: str):
    """(line number, text) of what the docs present as commands: code blocks line by line (up to a ' # '
    comment) and inline code spans."""
    block = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            block = not block
            continue
        for span in (re.split(r"\s#\s|\s#$", line) if block else re.findall(r"`([^`]*)`", line)):
            yield n, span


def flags_of(words: str) -> set[str] | None:
    """The options of `tokweight WORDS`, or None if there is no such command."""
    command = cli
    for word in words.split():
        if not isinstance(command, click.Group) or word not in command.commands:
            return None
        command = command.commands[word]
    opts = lambda param: (*getattr(param, "opts", []), *getattr(param, "secondary_opts", []))  # --no-X: a switch's off
    return {opt for param in command.params for opt in opts(param)} | {"--help"}


def test_every_command_and_flag_the_docs_write_exists():
    bad = []
    for path in DOCS:
        for n, span in spans(path.read_text()):
            for match in COMMAND.finditer(span):
                known = flags_of(match.group(1))
                where = f"{path.relative_to(ROOT)}:{n}"
                if known is None:
                    bad.append(f"{where}: tokweight {match.group(1)}")
                    continue
                args = match.group(2).split(" tokweight ")[0]
                bad += [f"{where}: tokweight {match.group(1)} {flag}" for flag in FLAG.findall(args)
                        if flag not in known]
    assert not bad, "the docs name commands or flags the CLI does not have:\n" + "\n".join(bad)


def test_the_command_reference_is_the_clis_own_help():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = (ROOT / "docs" / "cli.md").read_text()
    missing = [name for name in all_commands(cli) if f"## tokweight {name}\n" not in text]
    assert not missing, f"docs/cli.md lacks the commands {missing}"


def all_commands(group: click.Group, prefix: str = "") -> list[str]:
    """Every command's words under ``group``, subcommands included."""
    out = []
    for name, command in group.commands.items():
        out.append(f"{prefix}{name}")
        if isinstance(command, click.Group):
            out += all_commands(command, f"{prefix}{name} ")
    return out


def test_every_command_that_runs_the_model_reads_config_and_set():
    """The commands that run the model, and those that read files, take --config FILE and --set FIELD=VALUE."""
    configured = {"train", "train-base", "extract", "eval", "generate", "encode", "export", "experiment", "plan", "demo",
                  "sql", "inspect", "convert", "synth"}
    lacking = [name for name in configured if not {"--config", "--set"} <= flags_of(name)]
    assert not lacking, f"commands without --config or --set: {lacking}"
    assert set(all_commands(cli)) - configured == {"export-hf", "store", "store ls", "store verify"}


@pytest.mark.parametrize("text, expected", [("`tokweight train --nope 1`", ["tokweight train --nope"]),
                                            ("`tokweight trane --k 2`", ["tokweight trane"]),
                                            ("```\ntokweight eval --run R --data D   # --not-a-flag\n```", [])])
def test_the_check_sees_a_wrong_flag_or_command(text, expected):
    found = []
    for _, span in spans(text):
        for match in COMMAND.finditer(span):
            known = flags_of(match.group(1))
            if known is None:
                found.append(f"tokweight {match.group(1)}")
            else:
                found += [f"tokweight {match.group(1)} {f}" for f in FLAG.findall(match.group(2)) if f not in known]
    assert found == expected
