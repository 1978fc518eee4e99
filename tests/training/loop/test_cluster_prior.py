"""The base's grouping of the lines as the E-step's prior (``estep.cluster_weight``) in a run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.training.loop.test_sync_guard import config
from tokweight.pipeline.ranks import Ranks
from tokweight.training.config.components import EStepConfig
from tokweight.training.loop.setup import pooled_states, setup
from tokweight.training.loop.train import run as train
from tokweight.training.objective.clusters import CLUSTER_LINES, Clusters


def test_a_resumed_run_weighs_in_the_grouping_of_the_init_checkpoint_not_of_its_trained_weights(tiny, tiny_store,
                                                                                                  tmp_path):
    """The centres are fitted before a resume loads trained weights: a run's centres, fresh or resumed, are the init
    checkpoint's (so a resumed run goes on with the prior it had), and fitting the trained weights gives others."""
    data, ckpt = tiny
    cfg = config(data, ckpt, tmp_path / "run", tiny_store, steps=4, estep=EStepConfig(cluster_weight=1.0))
    fresh = setup(cfg, Ranks()).clusters
    train(cfg)
    resumed = setup(replace(cfg, optim=replace(cfg.optim, steps=6)), Ranks())
    assert resumed.progress.step == 4
    assert torch.equal(resumed.clusters.centres, fresh.centres) and resumed.clusters.spread == fresh.spread
    trained = Clusters.fit(pooled_states(resumed.model, resumed.spec, CLUSTER_LINES), cfg.cvae.k)
    assert not torch.equal(trained.mean, fresh.mean)


@pytest.mark.parametrize("cluster_map", ["agreement", "matched"])
def test_the_agreement_table_learns_from_the_steps_and_a_resumed_run_goes_on_with_it(tiny, tiny_store, tmp_path,
                                                                                   cluster_map):
    """Under ``cluster_map`` "agreement" and "matched" the table leaves independence as the run trains, is saved
    with the checkpoint, and a resumed run starts from it; a fresh run starts independent."""
    data, ckpt = tiny
    estep = EStepConfig(cluster_weight=3.0, cluster_relative=True, cluster_map=cluster_map)
    cfg = config(data, ckpt, tmp_path / "run", tiny_store, steps=4, estep=estep)
    fresh = setup(cfg, Ranks())
    k = cfg.cvae.k
    assert torch.equal(fresh.agreement.joint, torch.full((k, k), 1.0 / k ** 2))
    train(cfg)
    resumed = setup(replace(cfg, optim=replace(cfg.optim, steps=6)), Ranks())
    assert resumed.progress.step == 4
    assert not torch.allclose(resumed.agreement.joint, fresh.agreement.joint)
    assert torch.allclose(resumed.agreement.joint.sum(), torch.tensor(1.0))
    identity = config(data, ckpt, tmp_path / "identity", tiny_store, steps=4,
                      estep=replace(estep, cluster_map="identity"))
    assert setup(identity, Ranks()).agreement is None
