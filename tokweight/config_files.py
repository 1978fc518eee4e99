"""Configuration from files: the one mechanism behind every command's `--config` and `--set` (``tokweight.commands.flags``
builds a command's config with it) and every preset.

A configuration is a nested mapping of a config dataclass's fields (``TrainConfig.to_json``'s shape), read from
a TOML or JSON file (a run's own config.json is valid input). ``--set group.field=value`` changes one
field, the value read as a TOML literal (``0.5``, ``true``, ``"prefix"``, ``[0, 1]``) or else as a string.
Presets are such files in ``tokweight/presets/<kind>/<name>.toml``: ``synth`` (SynthConfig), ``base``
(BaseTrainConfig), ``demo`` (the demo's task and budget), ``recipes`` (TrainConfig overrides the experiments
compare against the defaults), ``experiment`` (the synthetic jobs' task and each job's --quick). The dataclasses
are the schema and hold every default: ``build`` makes one from a mapping, nested dataclasses and tuples
included, and refuses a field it does not have by its dotted name; ``preset_config`` reads a preset as the fields
it changes over the dataclass's defaults (or over a given instance), a nested group field by field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomllib

from tokweight.pipeline.config_build import build, defaults, plain

PRESETS = Path(__file__).parent / "presets"
DEFAULT_PRESET = "default"
"""The preset a command with ``--preset`` reads unless told another."""


def read(path: str | Path) -> dict:
    """A configuration file as a mapping: .toml, or .json (a run's config.json)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the configuration file ({e.strerror})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a valid {path.suffix.lstrip('.') or 'JSON'} configuration ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a configuration is a mapping of groups and fields, not a {type(data).__name__}")
    return data


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML literal, or else the text itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def assignment(item: str) -> tuple[str, Any]:
    """"group.field=value" -> ("group.field", value)."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {item!r}: write group.field=value, e.g. --set loss.beta=0.5")
    return key.strip(), parse_value(value.strip())


def with_values(config: dict, values: dict[str, Any]) -> dict:
    """``config`` with each dotted key set to its value (groups created as needed); the input is not changed."""
    out = json.loads(json.dumps(config))  # a deep copy of plain data
    for dotted, value in values.items():
        *groups, name = dotted.split(".")
        node = out
        for group in groups:
            child = node.setdefault(group, {})
            if not isinstance(child, dict):
                raise ValueError(f"{dotted}: {group} is a field, not a group")
            node = child
        node[name] = value
    return out


def with_sets(config: dict, items: list[str] | tuple[str, ...]) -> dict:
    """``config`` with every ``--set`` assignment applied, in order."""
    return with_values(config, dict(assignment(item) for item in items))


def flat(config: dict, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as its dotted keys: {"loss": {"beta": 0.3}} -> {"loss.beta": 0.3}."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (PRESETS / kind).glob("*.toml"))


def preset(kind: str, name: str) -> dict:
    """Preset ``name`` of ``kind`` (a file in tokweight/presets/<kind>/)."""
    path = PRESETS / kind / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"no {kind} preset {name!r}: choose one of {preset_names(kind)}")
    return read(path)


def preset_config(cls, kind: str, name: str, on=None, **fields):
    """The dataclass ``cls`` from preset ``name`` of ``kind``: its fields over ``on`` (an instance of ``cls``;
    None: ``cls``'s defaults), a nested group field by field over that group's own, then ``fields`` (dotted
    names: values)."""
    start = plain(on) if on is not None else defaults(cls)
    return build(cls, with_values(start, flat(preset(kind, name)) | plain(fields)))
