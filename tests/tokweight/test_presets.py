"""Presets are files, loaded by one mechanism (config_files.preset_config): each builds its dataclass and states
only fields whose value differs from the defaults it is read over, so the dataclasses hold every default once."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.config_files import PRESETS, defaults, flat, plain, preset, preset_config, preset_names
from tokweight.demo import DemoPreset, demo_preset
from tokweight.experiments.artefacts import TaskConfig, synthetic_task
from tokweight.experiments.grid import ExperimentConfig
from tokweight.experiments.own_task import OwnTaskConfig
from tokweight.experiments.sweep import SweepConfig
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import config_dict
from tokweight.training.config.base import BaseTrainConfig

PATHS = {"data": "D", "out": "O"}


def read_over() -> dict[str, tuple[type, object, dict]]:
    """kind/name -> (its dataclass, the instance it is read over or None: the dataclass's defaults, the fields
    given besides) for every preset file but the recipes (tests/tokweight/test_recipes.py)."""
    out = {f"synth/{n}": (SynthConfig, None, {}) for n in preset_names("synth")}
    out |= {f"base/{n}": (BaseTrainConfig, None, PATHS) for n in preset_names("base")}
    out |= {f"demo/{n}": (DemoPreset, None, {}) for n in preset_names("demo")}
    return out | {"experiment/task": (TaskConfig, None, {}),
                  "experiment/grid-quick": (ExperimentConfig, ExperimentConfig(out="O"), {}),
                  "experiment/sweep-quick": (SweepConfig, SweepConfig(out="O"), {}),
                  "experiment/own-quick": (OwnTaskConfig, OwnTaskConfig(checkpoint="C", data="D", out="O"), {})}


def holds(built, value) -> bool:
    """Whether ``built`` has ``value``: a mapping's fields (a dataclass read from a partial table has its other
    fields too), a list's items, else equality."""
    if isinstance(value, dict):
        return all(holds(built[k], v) for k, v in value.items())
    if isinstance(value, list):
        return len(built) == len(value) and all(holds(b, v) for b, v in zip(built, value))
    return built == value and type(built) is type(value)


def test_every_preset_builds_its_dataclass_and_states_only_what_differs():
    files = {f"{p.parent.name}/{p.stem}" for p in PRESETS.glob("*/*.toml") if p.parent.name != "recipes"}
    cases = read_over()
    assert set(cases) == files  # a new preset file is checked here too
    for name, (cls, on, fields) in cases.items():
        kind, stem = name.split("/")
        built = preset_config(cls, kind, stem, on=on, **fields)
        assert isinstance(built, cls)
        before = flat(plain(on) if on is not None else defaults(cls))
        for field, value in flat(preset(kind, stem)).items():
            assert before.get(field, object()) != value, f"{name}: {field} = {value!r} is the default already"
            assert holds(flat(plain(built))[field], value), (name, field)


def test_a_nested_group_is_read_field_by_field_over_its_default():
    """demo/default.toml names two of the task's base fields: the others stay the synthetic task's, which is
    what makes the demo's data and base the experiments' h0-n16 ones."""
    demo, task = demo_preset("default"), synthetic_task()
    assert demo.task.synth == task.synth and demo.task.base.n_layer == task.base.n_layer
    assert (demo.task.base.steps, demo.task.settings[0].name) == (1500, "h0-n16") != (task.base.steps, "h3-n5")
    with pytest.raises(ValueError, match="task.base.stepz: no such field"):
        preset_config(DemoPreset, "demo", "default", **{"task.base.stepz": 3})
    with pytest.raises(ValueError, match="no synth preset 'huge'"):
        preset_config(SynthConfig, "synth", "huge")


def test_the_commands_offer_the_preset_files(tmp_path):
    """--preset's choices are the files, and synth --preset tiny writes the tiny preset's dataset."""
    helps = {cmd: " ".join(CliRunner().invoke(main, [cmd, "--help"]).output.split())
             for cmd in ("synth", "train-base", "demo")}
    for cmd, kind in (("synth", "synth"), ("train-base", "base"), ("demo", "demo")):
        assert f"[{'|'.join(preset_names(kind))}]" in helps[cmd], cmd
    result = CliRunner().invoke(main, ["synth", "--preset", "tiny", "--out", str(tmp_path / "d"), "--seed", "3"])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "d" / "dataset.json").read_text())["config"]
    assert written == plain(config_dict(preset_config(SynthConfig, "synth", "tiny", seed=3)))  # kind: the default
