"""Named recipes: TrainConfig overrides that make the discrete latent learnable.

A recipe sets only the remedy fields (TrainConfig's ``remedies`` group: E-step, latent
embedding init, aggressive posterior updates; and the posterior's fields of its ``cvae``
group: pooling, encoder), never what an experiment varies (weighting, beta, policy, z
pathway, steps), so ``with_recipe(cfg, name)`` composes with any experiment grid.
Measurements behind each recipe: docs/latent-learnability.md.

Recommended: ``scratch`` to find z from scratch with beta keeping its meaning in J (the
exact E-step of J, latent rows centred on the checkpoint's mean row, the mean-pooled
posterior read; use it with a z pathway of 2 or more slots and a beta warm-up, see
docs/results/from-scratch/); ``em-balanced`` to learn z at beta = 0 on the default task.
"""

from __future__ import annotations

from dataclasses import fields, replace

from tokweight.training.train_config import RemedyConfig

REMEDY_FIELDS = frozenset({f.name for f in fields(RemedyConfig)} | {"cvae"})  # "cvae": its CVAE_REMEDY_FIELDS
CVAE_REMEDY_FIELDS = frozenset({"posterior_pool", "posterior_encoder", "encoder_layers", "encoder_d_model"})

RECIPES: dict[str, dict] = {
    # The plain exact-expectation objective on the checkpoint's latent embeddings.
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
    # em-exact's E-step on an intact decoder: centred rows at norm 1 (orthogonal rows of norm 3 put
    # the h0-n16 decoder at 5.15 nats per token at step 0, centred ones at 0.067) and the posterior
    # read where the strategy is (the mean S state, not <eos>). Found z from scratch at h0-n16 with a
    # 2- or 4-slot prefix, not with one slot (docs/results/from-scratch/).
    "scratch": {"latent_embedding_norm": 1.0, "latent_embedding_center": True, "cvae": {"posterior_pool": "mean"},
                "estep": {"mode": "soft", "follow_beta": True, "prior": "learned", "balance_iters": 3}},
    # Not a way to find z: a supervised warm start (z = the true strategy for 200 steps; decoder
    # intact thanks to centred latent rows; a posterior that reads the mean S state, where the
    # strategy is), then the plain objective. It asks whether a z in use *survives* the step's
    # beta, which is what the collapse threshold is about (training/experiments/sweep.py).
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
    """Recipe ``name``'s TrainConfig overrides (a copy), checked to be remedy fields only."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    overrides = dict(RECIPES[name])
    check_recipe(overrides)
    return overrides


def with_recipe(cfg, name: str):
    """``cfg`` (a TrainConfig) with recipe ``name``'s remedy fields set; the rest unchanged. A recipe's
    estep replaces the whole E-step config (RemedyConfig turns the dict into one)."""
    overrides = recipe_overrides(name)
    cvae = overrides.pop("cvae", {})
    return replace(cfg, remedies=replace(cfg.remedies, **overrides), cvae=replace(cfg.cvae, **cvae))
