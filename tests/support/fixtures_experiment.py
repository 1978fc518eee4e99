"""A tiny task for the experiment and sweep tests, and one results directory shared by both
(so the sweep reuses the data, base models and stores the experiment test built)."""

from __future__ import annotations

import pytest
import torch

from tokweight.pipeline.data.config import SynthConfig
from tokweight.experiments.cells import CellBudget
from tokweight.experiments.artefacts import Setting, TaskConfig, base_model

TINY_TASK = TaskConfig(settings=(Setting("h0", 0, 3, 5), Setting("h2", 2, 3, 5)),
                       synth=SynthConfig(alphabet_size=6, strategies=("copy", "rotate-left"), n_train=256, n_val=64,
                                         n_test=64, shard_size=128),
                       base=base_model(20, batch_size=32, n_head=2, d_model=32))
TINY_BUDGET = CellBudget(steps=3, batch_size=16, decode_examples=8)


@pytest.fixture(scope="session")
def experiment_root(tmp_path_factory):
    torch.set_num_threads(1)
    return tmp_path_factory.mktemp("experiment")
