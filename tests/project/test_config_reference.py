"""docs/reference.md lists every TrainConfig field as the dataclasses define it (scripts/config_reference.py)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "config_reference.py"


def test_the_list_of_config_fields_is_current():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_field_is_listed_with_its_docstring_and_default():
    script = runpy.run_path(str(SCRIPT))
    rows = {name: (default, doc) for name, default, doc in script["rows"](script["TrainConfig"])}
    assert not [name for name, (_, doc) in rows.items() if not doc], "fields without a docstring"
    assert rows["loss.beta"] == ("0.3", "The KL weight after the warm-up.")
    assert rows["io.checkpoint"][0] == "required"
    assert rows["optim.stop.patience"][0] == "7"  # a nested group is expanded
    table = script["table"]()
    assert "| `optim.starts` | `None`: 3 discrete, 1 continuous |" in table
    assert "p(k\\|x)" in table  # a pipe inside a cell is escaped


def test_the_check_sees_a_stale_list():
    script = runpy.run_path(str(SCRIPT))
    text = (ROOT / "docs" / "reference.md").read_text()
    stale = text.replace("| `loss.beta` | `0.3` |", "| `loss.beta` | `0.5` |")
    assert stale != text and script["rendered"](stale) == text


def test_every_command_has_its_config_classes_listed():
    """Each command of the CLI is train (the list above), a command of ``COMMANDS`` whose every config class has a
    table of documented fields, or one that takes no configuration."""
    from tokweight.cli import main

    script = runpy.run_path(str(SCRIPT))
    words = set()
    for name, command in main.commands.items():
        words.add(name)
        words |= {f"{name} {sub}" for sub in getattr(command, "commands", {})}
    assert words == {"train"} | set(script["COMMANDS"]) | set(script["WITHOUT_CONFIG"])
    text = (ROOT / "docs" / "reference.md").read_text()
    for command, classes in script["COMMANDS"].items():
        for cls in classes:
            assert f"#### `tokweight {command}`: `{cls.__name__}`" in text, (command, cls.__name__)
            rows = list(script["rows"](cls, groups=True))
            undocumented = [name for name, _, doc in rows if not doc]
            assert rows and not undocumented, f"{cls.__name__}: fields without a docstring: {undocumented}"
    extract = {name: default for name, default, _ in script["rows"](script["COMMANDS"]["extract"][0], groups=True)}
    assert extract["batch_tokens"] == "16384" and extract["retry.attempts"] == "5" and extract["data"] == "required"
