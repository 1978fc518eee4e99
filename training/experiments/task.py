"""What every experiment runs on: the T/(t0+1) settings, and per setting the data and the base model.

A TaskConfig holds the generator's and the base trainer's own configs, so every field they
have is settable here and hashed into the artefacts' keys (training.experiments.artefacts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from tokweight.pipeline.synth import SynthConfig
from tokweight.training.train_base import BaseTrainConfig


@dataclass(frozen=True)
class Setting:
    """One T/(t0+1) setting: the synthetic generator's header and length knobs."""

    name: str
    """Label in tables and directory names ([a-z0-9-])."""
    header_len: int
    """Header tokens before s(x): t0 moves later and T grows by this much."""
    min_len: int
    """Shortest x; T = header_len + len(x) + 1."""
    max_len: int
    """Longest x."""

    def __post_init__(self):
        if not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise ValueError(f"setting name must be non-empty [a-z0-9-], got {self.name!r}")
        if self.header_len < 0 or not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"setting {self.name}: need header_len >= 0 and 1 <= min_len <= max_len")


# x of one fixed length per setting, so T is the same for every example. Measured here with
# 2 layers, d=64, 3000 steps: copy/reverse on 16 symbols stayed at 0.83 nats after t0 (and
# varying lengths of 7-9 at ~0.8); copy/rotate-left over 32 symbols is learnt (a constant
# offset, and few repeated symbols for the copy to confuse).
DEFAULT_SETTINGS = (Setting("h3-n5", 3, 5, 5), Setting("h1-n8", 1, 8, 8), Setting("h0-n16", 0, 16, 16))


def base_model(steps: int = 3000, **fields) -> BaseTrainConfig:
    """A base-model config evaluated once, at its last step, with a warm-up of a tenth of its steps
    (at most 100); ``data`` and ``out`` are left empty, each setting fills in its own."""
    return BaseTrainConfig(data="", out="", steps=steps, eval_every=steps,
                           warmup_steps=min(100, max(1, steps // 10)), **fields)


def coerce_nested(cfg, **types) -> None:
    """Nested config fields given as dicts (a config read back from JSON) become their dataclass."""
    for name, cls in types.items():
        if isinstance(getattr(cfg, name), dict):
            object.__setattr__(cfg, name, cls(**getattr(cfg, name)))


@dataclass(frozen=True)
class TaskConfig:
    """The data and the base model of every setting (shared by the experiment and the sweep)."""

    settings: tuple[Setting, ...] = DEFAULT_SETTINGS
    """T/(t0+1) settings, smallest first; the last is 'the largest' for the z-pathway cells."""
    synth: SynthConfig = SynthConfig(alphabet_size=32, strategies=("copy", "rotate-left"), n_train=8000, n_val=512,
                                     n_test=512, shard_size=1000)
    """The generator; each setting replaces its header_len, min_len and max_len. The discrete
    latent has K = len(synth.strategies)."""
    base: BaseTrainConfig = field(default_factory=base_model)
    """The base model's training; each setting fills in data and out."""

    def __post_init__(self):
        object.__setattr__(self, "settings", tuple(s if isinstance(s, Setting) else Setting(**s)
                                                   for s in self.settings))
        coerce_nested(self, synth=SynthConfig, base=BaseTrainConfig)
        names = [s.name for s in self.settings]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"settings need distinct names, got {names}")
        if self.k < 2:
            raise ValueError("need at least two strategies (the latent has K = #strategies)")
        if self.base.k_max < self.k:
            raise ValueError(f"base.k_max = {self.base.k_max} latent tokens, but K = {self.k} strategies")

    @property
    def k(self) -> int:
        return len(self.synth.strategies)


def synth_config(task: TaskConfig, setting: Setting) -> SynthConfig:
    return replace(task.synth, header_len=setting.header_len, min_len=setting.min_len, max_len=setting.max_len)


def base_config(task: TaskConfig, data: Path, out: Path) -> BaseTrainConfig:
    return replace(task.base, data=str(data), out=str(out))
