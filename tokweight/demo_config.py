"""`tokweight demo`'s configuration.

Imports only the standard library and config modules, so that the CLI builds its options from these fields
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokweight.config_files import preset_names

WEIGHTINGS = ("uniform", "surprisal-share")
"""The two reconstructions the demo compares; everything else is the default configuration."""


@dataclass(frozen=True)
class DemoConfig:
    out: str = "demo"
    """Directory for data/, base/, store/, cvae-<weighting>/, report/ and demo.md."""
    preset: str = "default"
    """A preset of tokweight/presets/demo/."""
    seed: int = 0
    """Seeds the data, the base model and the CVAEs."""
    arms: tuple[str, ...] = field(default=WEIGHTINGS)
    """The weightings compared."""

    def __post_init__(self):
        if self.preset not in preset_names("demo"):
            raise ValueError(f"preset must be one of {preset_names('demo')}, got {self.preset!r}")
