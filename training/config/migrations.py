"""Old configurations: every change to what a run's config.json holds, as one ordered list of migrations
(``MIGRATIONS``) that every read of a TrainConfig from a mapping goes through (``train_config_from``): `train
--config` (a config file or a run's config.json, with the flags over it), a resume, eval, encode, generate, export
and the experiments (``run_dir.read_config``). So a run's config.json, of any version, trains, resumes and
evaluates as the run it was.

A migration takes the mapping as written and returns it in this version's terms; one it does not concern passes
unchanged, so a config of this version passes through every one. Plain data and the standard library only
(``tests/training/config/test_config_modules.py``).
"""

from __future__ import annotations

from tokweight.pipeline.config_build import build
from tokweight.training.config.train import TrainConfig

RUN_CVAE_FIELDS = ("latent", "k", "z_dim", "prior", "cond", "slots", "posterior_pool")
"""The ``cvae`` fields every run's config.json has named since the config had groups. A run writes every field
(``TrainConfig.to_json``); a config file a person writes names the ones it changes."""


def from_remedies(obj: dict) -> dict:
    """A config.json of before the ``estep`` group: its ``remedies`` group ({"estep": {...},
    "latent_embedding_norm", "latent_embedding_center"}, whose own defaults were "no remedy") as ``estep`` and
    the ``cvae`` fields of the latent rows' start; the fields since removed, where they hold their one value."""
    if "remedies" not in obj:
        return obj
    obj, remedies = dict(obj), dict(obj["remedies"] or {})
    del obj["remedies"]
    estep = {"mode": "off", "follow_beta": False, "prior": "uniform", **(remedies.pop("estep", None) or {})}
    obj["estep"] = drop_defaults(estep, {"posterior_weight": 1.0})
    cvae = drop_defaults(dict(obj.get("cvae") or {}),
                         {"posterior_encoder": "shared", "encoder_layers": 1, "encoder_d_model": 64})
    obj["cvae"] = {**cvae, "latent_init_norm": remedies.pop("latent_embedding_norm", 0.0),
                   "latent_init_center": remedies.pop("latent_embedding_center", False)}
    obj["optim"] = drop_defaults(dict(obj.get("optim") or {}), {"weight_decay": 0.0})
    return obj


def from_beta_group(obj: dict) -> dict:
    """A config.json of before beta's fields joined ``loss``: its ``loss.beta`` group {"beta", "warmup_steps"}."""
    loss = obj.get("loss") or {}
    if not isinstance(loss.get("beta"), dict):
        return obj
    beta = dict(loss["beta"])
    flat = {**loss, "beta": beta.pop("beta", 0.3), **({"beta_warmup_steps": beta.pop("warmup_steps")}
                                                       if "warmup_steps" in beta else {}), **beta}
    return {**obj, "loss": flat}


def without_posterior_likelihood(obj: dict) -> dict:
    """A run's config.json of before ``cvae.posterior_likelihood``: its run trained the posterior head alone, so the
    field reads false. A run's, by ``written_by_a_run``; a config file that does not name the field gets the
    field's default."""
    cvae = obj.get("cvae")
    if not written_by_a_run(obj) or "posterior_likelihood" in cvae:
        return obj
    return {**obj, "cvae": {**cvae, "posterior_likelihood": False}}


def without_cluster_fields(obj: dict) -> dict:
    """A run's config.json of before the base's grouping was the default: the E-step fields it does not name held
    the values that meant "off" (``cluster_weight`` 0) and the first form of the cost (in nats, value k cluster k).
    A config file that does not name them gets their defaults."""
    return with_estep_of_before(obj, {"cluster_weight": 0.0, "cluster_relative": False, "cluster_map": "identity"})


def without_label_map(obj: dict) -> dict:
    """A run's config.json of before labelled lines followed the decoders' values: label k's lines were fixed to value
    k (``estep.label_map`` "identity"). A config file that does not name it gets the default."""
    return with_estep_of_before(obj, {"label_map": "identity"})


def with_estep_of_before(obj: dict, before: dict) -> dict:
    """``obj`` with the E-step fields of ``before`` that a run's config.json does not name set to the values they
    held before the field existed; a config file (not written by a run) as it is."""
    if not written_by_a_run(obj):
        return obj
    estep = obj.get("estep") or {}
    return {**obj, "estep": {**{k: v for k, v in before.items() if k not in estep}, **estep}}


def written_by_a_run(obj: dict) -> bool:
    """Whether ``obj`` is a run's config.json (flags over it or not): its ``cvae`` group names every field of
    ``RUN_CVAE_FIELDS``."""
    cvae = obj.get("cvae")
    return isinstance(cvae, dict) and all(name in cvae for name in RUN_CVAE_FIELDS)


def drop_defaults(group: dict, removed: dict) -> dict:
    """``group`` without the removed fields that hold their one value (any other is left to be refused)."""
    return {k: v for k, v in group.items() if not (k in removed and v == removed[k])}


MIGRATIONS = (from_remedies, from_beta_group, without_posterior_likelihood, without_cluster_fields,
              without_label_map)
"""Every migration, oldest first; each reads what the ones before it wrote."""


def migrated(obj: dict) -> dict:
    """``obj`` (a config's nested mapping, any version) in this version's terms."""
    for migration in MIGRATIONS:
        obj = migration(obj)
    return obj


def train_config_from(obj: dict) -> TrainConfig:
    """The TrainConfig of a nested mapping of its groups, of any version (``migrated``, then
    ``config_build.build``): a run's config.json, or a config file with the flags over it. A group or field this
    version does not have is refused by its dotted name; a value of the wrong kind by what it is."""
    try:
        return build(TrainConfig, migrated(obj))
    except TypeError as e:  # a required field missing, or a value of the wrong type
        raise ValueError(f"configuration: {e}") from None
