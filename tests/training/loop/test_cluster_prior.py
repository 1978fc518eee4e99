"""The base's grouping of the lines as the E-step's prior (``estep.cluster_weight``) in a run."""

from __future__ import annotations

from dataclasses import replace

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
