"""Labelled lines in a run (``estep.labelled``): fixed to the values the decoders give their labels
(``estep.label_map`` "matched"), a table the checkpoint keeps."""

from __future__ import annotations

import json
from dataclasses import replace

import torch

from tests.training.loop.test_sync_guard import config
from tokweight.pipeline.ranks import Ranks
from tokweight.training.config.components import EStepConfig
from tokweight.training.loop import step as step_module
from tokweight.training.loop.setup import setup
from tokweight.training.loop.stream import first_lines
from tokweight.training.loop.train import run as train
from tokweight.training.objective.estep import step_labels


def test_the_e_step_fixes_a_labelled_line_to_its_labels_matched_value_not_to_the_labels_index(tiny, tiny_store,
                                                                                             tmp_path, monkeypatch):
    data, ckpt = tiny
    cfg = config(data, ckpt, tmp_path / "run", tiny_store, steps=2, estep=EStepConfig(labelled=0.5))
    state = setup(cfg, Ranks())
    L, K = state.label_values.joint.shape
    assert L == len(state.strategy_names) and K == cfg.cvae.k
    perm = torch.roll(torch.arange(K), 1)[:L]  # label l's lines: value l - 1 (mod K)
    joint = torch.full((L, K), 1e-3)
    joint[torch.arange(L), perm] = 1.0
    state.label_values.joint.copy_(joint / joint.sum())
    seen = []
    real = step_module.step_loss
    monkeypatch.setattr(step_module, "step_loss", lambda *a, **kw: seen.append(a[7]) or real(*a, **kw))
    batch = next(first_lines(state.spec, cfg.optim.batch_size))
    step_module.step_terms(state, batch, cfg)
    raw = step_labels(state.schedule.at(0).estep, batch.strategies, state.strategy_names, batch.keys)
    assert (raw >= 0).any() and (raw < 0).any()
    want = torch.where(raw >= 0, perm[raw.clamp(min=0)], raw)
    assert torch.equal(seen[0], want)
    identity = config(data, ckpt, tmp_path / "identity", tiny_store, steps=2,
                      estep=EStepConfig(labelled=0.5, label_map="identity"))
    assert setup(identity, Ranks()).label_values is None
    assert setup(config(data, ckpt, tmp_path / "none", tiny_store, steps=2), Ranks()).label_values is None


def test_the_table_learns_from_the_steps_and_a_resumed_run_goes_on_with_it(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    cfg = config(data, ckpt, tmp_path / "run", tiny_store, steps=4, estep=EStepConfig(labelled=0.5))
    fresh = setup(cfg, Ranks()).label_values.joint.clone()
    assert torch.equal(fresh, torch.full(fresh.shape, 1.0 / fresh.numel()))
    train(cfg)
    saved = json.loads(next((tmp_path / "run").glob("checkpoint*/state.json")).read_text())["label_values"]
    resumed = setup(replace(cfg, optim=replace(cfg.optim, steps=6)), Ranks())
    assert resumed.progress.step == 4
    assert torch.equal(resumed.label_values.joint, torch.tensor(saved))
    assert not torch.allclose(resumed.label_values.joint, fresh)
    assert torch.allclose(resumed.label_values.joint.sum(), torch.tensor(1.0))
