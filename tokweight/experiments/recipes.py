"""The recipes the experiments compare against `tokweight train`'s defaults: TrainConfig overrides, one file
each in tokweight/presets/recipes/ (``config_files.preset``).

A recipe says how the latent is made learnable (the E-step, the latent rows' start, what the posterior reads),
never what an experiment varies (weighting, beta, policy, z pathway, steps), so ``with_recipe(cfg, name)``
composes with any grid. "default" overrides nothing: what `tokweight train` runs.
"""

from __future__ import annotations

from typing import Any

from tokweight.config_files import flat, preset, with_values
from tokweight.training.config.migrations import train_config_from
from tokweight.training.config.train import TrainConfig, with_resolved_anew

RECIPE_FIELDS = ("estep.", "cvae.latent_init_norm", "cvae.latent_init_center", "cvae.posterior_pool")
"""The dotted fields a recipe may set (a prefix ending in "." names a whole group)."""


def recipe_overrides(name: str) -> dict[str, Any]:
    """Recipe ``name``'s dotted overrides, checked to be recipe fields only."""
    overrides = flat(preset("recipes", name))
    bad = sorted(k for k in overrides if not any(k == f or (f.endswith(".") and k.startswith(f))
                                                 for f in RECIPE_FIELDS))
    if bad:
        raise ValueError(f"recipe {name!r} sets {bad}: a recipe may set only {list(RECIPE_FIELDS)}")
    return overrides


def with_recipe(cfg: TrainConfig, name: str, extra: dict[str, Any] | None = None) -> TrainConfig:
    """``cfg`` with recipe ``name``'s overrides, then ``extra`` (dotted fields a cell compares)."""
    values = recipe_overrides(name) | (extra or {})
    start = cfg.to_json()
    return train_config_from(with_values(start, with_resolved_anew(values, start))) if values else cfg
