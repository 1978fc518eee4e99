"""Session-scoped data and checkpoints for the training tests (import the fixtures you use)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.config_files import preset_config
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import write_dataset
from tokweight.training.config.base import BaseTrainConfig
from tokweight.training.loop.train_base import run as train_base

AMP_T, AMP_T0 = 13, 1  # two strategy tokens, then ten filler tokens and </y>

# A fixture imported by several test modules gets one definition per module; this cache
# makes each artefact be built once per session all the same.
_BUILT: dict[str, tuple] = {}


def _once(name, build):
    if name not in _BUILT:
        _BUILT[name] = build()
    return _BUILT[name]


@pytest.fixture
def one_thread():
    """One torch thread for the test (CPU float sums in one order), the count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(data dir, checkpoint dir): the tiny synthetic preset and a 30-step base model."""
    def build():
        torch.set_num_threads(1)
        root = tmp_path_factory.mktemp("tiny")
        write_dataset(preset_config(SynthConfig, "synth", "tiny", seed=0), root / "data")
        train_base(preset_config(BaseTrainConfig, "base", "tiny", data=str(root / "data"), out=str(root / "base"),
                                 steps=30))
        return root / "data", root / "base"

    return _once("tiny", build)


def two_regime_samples(n: int, seed: int, max_x: int = 8) -> list[Sample]:
    """y = (c1, c2, e * 10): c1, c2 drawn independently of x (the strategy), the rest fixed.

    S = y + </y> has T = 13; the prefix y_<=t fits one strategy from t0 = 1 on, and a
    trained base model is sure of every token after it. x has 1..max_x symbols, so that
    the model cannot place </y> by absolute position (the z-conditioned template moves y).
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = tuple(rng.choice(list("abcd"), size=int(rng.integers(1, max_x + 1))))
        c1, c2 = rng.choice(["a", "b"]), rng.choice(["c", "d"])
        out.append(Sample(key=f"s{i:05d}", x=x, y=(c1, c2) + ("e",) * 10, strategy=c1 + c2, t0=AMP_T0))
    return out


@pytest.fixture(scope="session")
def two_regime(tmp_path_factory):
    """(data dir, checkpoint dir): two-regime data and a base model confident after t0."""
    def build():
        torch.set_num_threads(1)
        root = tmp_path_factory.mktemp("two_regime")
        for split, seed in (("train", 1), ("val", 2)):
            write_shards(two_regime_samples(256, seed), root / "data" / split, shard_size=128)
        train_base(BaseTrainConfig(data=str(root / "data"), out=str(root / "base"), steps=300, batch_size=32,
                                   d_model=32, n_head=2, eval_every=300, warmup_steps=10, lr=3e-3))
        return root / "data", root / "base"

    return _once("two_regime", build)


@pytest.fixture(scope="session")
def tiny_store(tiny, tmp_path_factory):
    """The tiny base model's baseline store over every split of the tiny data."""
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.extract import run as extract

    def build():
        data, ckpt = tiny
        store = tmp_path_factory.mktemp("tiny_store") / "store"
        extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), progress=False))
        return store

    return _once("tiny_store", build)


@pytest.fixture(scope="session")
def tiny_dropout(tiny, tmp_path_factory):
    """(data dir, checkpoint dir): the tiny base model with dropout 0.1, so that training draws from torch's
    global RNG (a resumed run must restore it)."""
    from tokweight.pipeline.models.checkpoint import load_checkpoint, save_checkpoint
    from tokweight.pipeline.models.gpt import GPT

    def build():
        data, ckpt = tiny
        base = load_checkpoint(ckpt)
        model = GPT(replace(base.model.cfg, dropout=0.1))
        model.load_state_dict(base.model.state_dict())
        out = tmp_path_factory.mktemp("tiny_dropout") / "base"
        save_checkpoint(out, model, base.vocab)
        return data, out

    return _once("tiny_dropout", build)
