"""The remedy presets the experiments compare against the default (``train_config.default_remedies``).

A recipe names a whole ``RemedyConfig`` (E-step, latent embedding init) and the posterior's CVAE
fields it needs, never what an experiment varies (weighting, beta, policy, z pathway, steps), so
``with_recipe(cfg, name)`` composes with any grid. "default" is what `tokweight train` runs; the
others are the research variants the default superseded, kept for the experiments that still
compare them (measurements: docs/latent-learnability.md, docs/results/).
"""

from __future__ import annotations

from dataclasses import asdict, fields, replace

from tokweight.training.train_config import RemedyConfig, default_remedies

REMEDY_FIELDS = frozenset({f.name for f in fields(RemedyConfig)} | {"cvae"})  # "cvae": its CVAE_REMEDY_FIELDS
CVAE_REMEDY_FIELDS = frozenset({"posterior_pool", "posterior_encoder", "encoder_layers", "encoder_d_model"})

RECIPES: dict[str, dict | None] = {
    # The default: train_config.default_remedies (the exact E-step of J, centred latent rows).
    "default": None,
    # No remedy: the plain exact-expectation objective on the checkpoint's latent embeddings.
    "baseline": {},
    # Distinct latent embeddings only (symmetry broken at init, plain objective).
    "spread": {"latent_embedding_norm": 3.0},
    # Distinct embeddings + hard EM with a uniform prior and a Sinkhorn-balanced batch
    # assignment (Shen et al. 2019; Caron et al. 2020); the amortised posterior is distilled.
    "em-balanced": {"latent_embedding_norm": 3.0, "estep": {"mode": "hard", "balance_iters": 3}},
    # As em-balanced, but the E-step is the exact one of J at the step's beta: q* proportional
    # to p(k|x) exp(-R(k) / beta), balanced; hard at beta = 0. The weighting's scale matters again.
    "em-exact": {"latent_embedding_norm": 3.0,
                 "estep": {"mode": "soft", "follow_beta": True, "prior": "learned", "balance_iters": 3}},
    # Not a way to find z: a supervised warm start (z = the true strategy for 200 steps; decoder
    # intact thanks to centred latent rows; a posterior that reads the mean S state, where the
    # strategy is), then the plain objective. It asks whether a z in use *survives* the step's
    # beta, which is what the collapse threshold is about (tokweight/experiments/sweep.py).
    "survival": {"latent_embedding_norm": 1.0, "latent_embedding_center": True, "cvae": {"posterior_pool": "mean"},
                 "estep": {"mode": "label", "until_step": 200}},
}


def check_recipe(overrides: dict) -> None:
    unknown = set(overrides) - REMEDY_FIELDS
    unknown |= {f"cvae.{k}" for k in set(overrides.get("cvae", {})) - CVAE_REMEDY_FIELDS}
    if unknown:
        raise ValueError(f"a recipe may set only remedy fields {sorted(REMEDY_FIELDS)} "
                         f"(cvae: {sorted(CVAE_REMEDY_FIELDS)}), not {sorted(unknown)}")


def recipe_overrides(name: str) -> dict:
    """Recipe ``name``'s fields (a copy; "default": the default remedies'), checked to be remedy fields only."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    if RECIPES[name] is None:
        return asdict(default_remedies("discrete"))
    overrides = dict(RECIPES[name])
    check_recipe(overrides)
    return overrides


def with_recipe(cfg, name: str):
    """``cfg`` (a TrainConfig) with recipe ``name``'s remedies: the whole RemedyConfig (fields the recipe does
    not name take RemedyConfig's "no remedy" values) and the CVAE fields it names; "default": the remedies
    ``TrainConfig`` gives the latent by default."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    if RECIPES[name] is None:
        return replace(cfg, remedies=default_remedies(cfg.cvae.latent))
    overrides = recipe_overrides(name)
    cvae = overrides.pop("cvae", {})
    return replace(cfg, remedies=RemedyConfig(**overrides), cvae=replace(cfg.cvae, **cvae))
