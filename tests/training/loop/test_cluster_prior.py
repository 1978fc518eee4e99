"""The base's grouping of the lines as the E-step's prior (``estep.cluster_weight``) in a run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from tests.training.loop.test_sync_guard import config
from tokweight.pipeline.ranks import Ranks
from tokweight.training.config.components import EStepConfig
from tokweight.training.loop.setup import first_pooled, setup
from tokweight.training.loop.stream import first_lines
from tokweight.training.loop.train import run as train
from tokweight.training.objective.clusters import CLUSTER_LINES, Clusters


def test_a_resumed_run_weighs_in_the_grouping_of_the_init_checkpoint_not_of_its_trained_weights(tiny, tiny_store,
                                                                                                  tmp_path):
    """The centres are fitted on the init checkpoint before the first step and kept with every checkpoint: a resumed
    run reads them back bitwise (so it goes on with the prior it had), where fitting its trained weights gives
    others; a checkpoint without them is refused by name, not refitted."""
    data, ckpt = tiny
    nats = EStepConfig(cluster_weight=1.0, cluster_relative=False, cluster_map="identity")
    cfg = config(data, ckpt, tmp_path / "run", tiny_store, steps=4, estep=nats)
    fresh = setup(cfg, Ranks()).clusters
    train(cfg)
    more = replace(cfg, optim=replace(cfg.optim, steps=6))
    resumed = setup(more, Ranks())
    assert resumed.progress.step == 4
    assert all(torch.equal(getattr(resumed.clusters, key), getattr(fresh, key)) for key in ("mean", "scale", "centres"))
    assert resumed.clusters.spread == fresh.spread
    trained = Clusters.fit(first_pooled(resumed.model, resumed.spec, CLUSTER_LINES, Ranks(), resumed.device,
                                        cfg.io.dtype, sharded=False), cfg.cvae.k)
    assert not torch.equal(trained.mean, fresh.mean)
    state = next((tmp_path / "run").glob("checkpoint*/state.json"))
    meta = json.loads(state.read_text())
    del meta["clusters"]
    state.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="holds no cluster centres"):
        setup(more, Ranks())


def test_the_z_free_forward_pools_what_the_step_reads(tiny, tiny_store, tmp_path):
    """``free_only`` (the forward the centres are fitted by) gives the step's own ``pooled`` and z-free NLL for the
    same batch, and nothing of the copies."""
    data, ckpt = tiny
    state = setup(config(data, ckpt, tmp_path / "run", tiny_store, steps=4), Ranks())
    batch = next(first_lines(state.spec, 8))
    state.model.eval()
    with torch.no_grad():
        whole, free = state.model(batch), state.model(batch, free_only=True)
    assert torch.allclose(free.pooled, whole.pooled, atol=1e-6) and torch.equal(free.zfree_nll, whole.zfree_nll)
    assert free.post is None and free.nll is None


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


class DealtRanks:
    """One of ``world`` ranks in this process: ``gather`` hands back the parts the other ranks left in ``parts``."""

    def __init__(self, rank: int, world: int, parts: dict):
        self.rank, self.world, self.parts = rank, world, parts
        self.is_main = rank == 0

    def gather(self, obj) -> list:
        self.parts[self.rank] = obj
        return [self.parts.get(r) for r in range(self.world)]


@pytest.mark.parametrize("sharded", [False, True])
def test_the_fit_s_lines_dealt_over_three_ranks_come_back_as_one_process_reads_them(tiny, tiny_store, tmp_path,
                                                                                   sharded):
    """Batch i goes to rank i mod 3 (a rank short of one batch under FSDP repeats the first, and drops it); rank 0
    gathers them in the lines' order: bitwise the states one process computes."""
    data, ckpt = tiny
    state = setup(config(data, ckpt, tmp_path / "run", tiny_store, steps=4), Ranks())
    lines = 7 * state.spec.batch_size - 1  # 7 batches, the last partial: ranks 0, 1, 2 take 3, 2, 2
    one = first_pooled(state.model, state.spec, lines, Ranks(), state.device, "float32", sharded=False)
    resharded = []
    state.model.reshard = lambda: resharded.append(True)  # what FSDP's root does after a forward without a backward
    parts: dict = {}
    others = [first_pooled(state.model, state.spec, lines, DealtRanks(r, 3, parts), state.device, "float32", sharded)
              for r in (2, 1)]
    dealt = first_pooled(state.model, state.spec, lines, DealtRanks(0, 3, parts), state.device, "float32", sharded)
    assert others == [None, None] and len(one) == lines and torch.equal(dealt, one)
    assert [len(p) for p in parts.values()] == [2, 2, 3] and len(resharded) == (3 if sharded else 0)
