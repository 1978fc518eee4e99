"""Old configurations (training/config/migrations.py): each migration turns an old run's config.json into the
TrainConfig it trained with, and every read path (`train --config`, resume, eval) resolves it alike."""

from __future__ import annotations

import json

import pytest

from tokweight.commands.train import train_config
from tokweight.training.config.migrations import MIGRATIONS, migrated, train_config_from
from tokweight.training.config.components import CVAEConfig, EStepConfig
from tokweight.training.loop.run_dir import config_differences, read_config
from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig, TrainConfig

IO = {"checkpoint": "/c", "data": "/d", "out": "/o", "store": "/s"}
OLD_CVAE = {"latent": "discrete", "k": 4, "z_dim": 8, "prior": "learned", "cond": "token", "slots": 1,
            "posterior_pool": "last"}  # every field a run wrote into its cvae group before posterior_likelihood


def run_config_without_posterior_likelihood(**groups) -> dict:
    """A run's config.json of this version but for ``cvae.posterior_likelihood``, which it does not name."""
    written = TrainConfig(IOConfig(**IO), **groups).to_json()
    del written["cvae"]["posterior_likelihood"]
    return written


def test_a_config_of_the_remedies_group_reads_as_its_estep_and_latent_rows():
    old = {"io": IO, "cvae": {**OLD_CVAE, "posterior_encoder": "shared", "encoder_layers": 1, "encoder_d_model": 64},
           "remedies": {"estep": {"mode": "soft", "posterior_weight": 1.0}, "latent_embedding_norm": 0.3,
                        "latent_embedding_center": True},
           "optim": {"steps": 50, "weight_decay": 0.0}}
    want = TrainConfig(IOConfig(**IO),
                       cvae=CVAEConfig(z_dim=8, cond="token", slots=1, posterior_pool="last", latent_init_norm=0.3,
                                       latent_init_center=True, posterior_likelihood=False),
                       estep=EStepConfig(mode="soft", follow_beta=False, prior="uniform", cluster_weight=0.0,
                                         cluster_relative=False, cluster_map="identity", label_map="identity"),
                       optim=OptimConfig(steps=50))
    assert train_config_from(old) == want
    no_remedy = train_config_from({"io": IO, "cvae": OLD_CVAE, "remedies": {}})  # the group's own defaults
    assert (no_remedy.estep.mode, no_remedy.cvae.latent_init_norm, no_remedy.cvae.latent_init_center) == \
        ("off", 0.0, False)
    with pytest.raises(ValueError, match="estep.posterior_weight: no such field"):  # a removed field in use
        train_config_from({"io": IO, "remedies": {"estep": {"posterior_weight": 0.5}}})


def test_a_config_of_the_beta_group_reads_as_the_loss_fields():
    old = {"io": IO, "loss": {"policy": "frozen", "beta": {"beta": 0.5, "warmup_steps": 10}}}
    assert train_config_from(old).loss == LossConfig(policy="frozen", beta=0.5, beta_warmup_steps=10)
    assert train_config_from({"io": IO, "loss": {"beta": {"warmup_steps": 0}}}).loss == \
        LossConfig(beta=0.3, beta_warmup_steps=0)  # the group's default beta


def test_a_run_config_of_before_posterior_likelihood_reads_false_and_a_config_file_the_default():
    assert train_config_from(run_config_without_posterior_likelihood()).cvae.posterior_likelihood is False
    assert train_config_from({"io": IO, "cvae": OLD_CVAE}).cvae.posterior_likelihood is False
    partial = {"io": IO, "cvae": {"k": 3, "cond": "query"}}  # what a person writes: the fields it changes
    assert train_config_from(partial).cvae.posterior_likelihood is True
    named = run_config_without_posterior_likelihood()
    named["cvae"]["posterior_likelihood"] = True
    assert train_config_from(named).cvae.posterior_likelihood is True  # a run's own value stands


def test_a_run_config_of_before_the_cluster_default_reads_as_it_trained_and_a_config_file_the_default():
    """A run's config.json without the cluster fields trained without the base's grouping (and one that named only
    the weight, with the first form: nats, value k cluster k); a config file gets the default, resolved per latent
    and mode."""
    old = TrainConfig(IOConfig(**IO)).to_json()
    for name in ("cluster_weight", "cluster_relative", "cluster_map"):
        del old["estep"][name]
    estep = train_config_from(old).estep
    assert (estep.cluster_weight, estep.cluster_relative, estep.cluster_map) == (0.0, False, "identity")
    old["estep"]["cluster_weight"] = 1.0
    estep = train_config_from(old).estep
    assert (estep.cluster_weight, estep.cluster_relative, estep.cluster_map) == (1.0, False, "identity")
    estep = train_config_from({"io": IO}).estep
    assert (estep.cluster_weight, estep.cluster_relative, estep.cluster_map) == (3.0, True, "matched")
    assert train_config_from({"io": IO, "estep": {"mode": "hard"}}).estep.cluster_weight == 3.0
    assert train_config_from({"io": IO, "estep": {"mode": "label"}}).estep.cluster_weight == 0.0
    assert train_config_from({"io": IO, "estep": {"mode": "off"}}).estep.cluster_weight == 0.0
    assert train_config_from({"io": IO, "cvae": {"latent": "continuous"}}).estep.cluster_weight == 0.0
    with pytest.raises(ValueError, match="cluster_weight 0, not"):
        train_config_from({"io": IO, "cvae": {"latent": "continuous"}, "estep": {"cluster_weight": 3.0}})


def test_a_run_config_of_before_labels_followed_the_values_reads_as_it_trained_and_a_config_file_the_default():
    """A run's config.json without ``estep.label_map`` fixed label k's lines to value k ("identity"); one that names
    it keeps it, and a config file gets "matched"."""
    old = TrainConfig(IOConfig(**IO)).to_json()
    del old["estep"]["label_map"]
    assert train_config_from(old).estep.label_map == "identity"
    old["estep"]["label_map"] = "matched"
    assert train_config_from(old).estep.label_map == "matched"
    assert train_config_from({"io": IO, "estep": {"labelled": 0.02}}).estep.label_map == "matched"
    with pytest.raises(ValueError, match="label_map must be one of"):
        train_config_from({"io": IO, "estep": {"label_map": "hungarian"}})


def test_a_resolved_cluster_weight_is_resolved_anew_when_the_latent_changes(tmp_path):
    """A discrete run's config.json holds the resolved weight 3; `--set cvae.latent=continuous` over it gets a
    continuous latent's 0, not a refusal, and `--set estep.mode=label` likewise."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(TrainConfig(IOConfig(**IO)).to_json()))
    assert read_config(run).estep.cluster_weight == 3.0
    assert train_config(str(run / "config.json"), {}, ("cvae.latent=continuous",)).estep.cluster_weight == 0.0
    assert train_config(str(run / "config.json"), {}, ("estep.mode=label",)).estep.cluster_weight == 0.0


def test_a_config_of_this_version_passes_every_migration_unchanged():
    current = TrainConfig(IOConfig(**IO)).to_json()
    assert migrated(current) == current and train_config_from(current) == TrainConfig(IOConfig(**IO))
    assert [m.__name__ for m in MIGRATIONS] == ["from_remedies", "from_beta_group", "without_posterior_likelihood",
                                                "without_cluster_fields", "without_label_map"]


def test_train_config_and_eval_and_resume_resolve_an_old_run_alike(tmp_path):
    """`train --config OLD/config.json` trains the run OLD trained (posterior_likelihood false, as eval and resume
    read it): the command line's config is the run directory's, and resuming OLD with it finds no difference."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps(run_config_without_posterior_likelihood()))
    given = train_config(str(old / "config.json"), {}, ())
    assert given.cvae.posterior_likelihood is False and read_config(old).cvae.posterior_likelihood is False
    assert given == read_config(old) and config_differences(read_config(old), given) == []
    continuous = train_config(str(old / "config.json"), {}, ("cvae.latent=continuous",))
    assert continuous.cvae.posterior_likelihood is False  # resolved anew from the latent, which has none
    discrete_k3 = train_config(str(old / "config.json"), {}, ("cvae.k=3",))
    assert discrete_k3.cvae.posterior_likelihood is False  # a flag over an old run keeps what it trained with
