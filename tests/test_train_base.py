import json
import math
from dataclasses import replace

import pytest

from pipeline.checkpoint import load_checkpoint
from pipeline.synth import PRESETS, consistent_at_t0, write_dataset
from training.train_base import BASE_PRESETS, BaseTrainConfig, run


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    write_dataset(replace(PRESETS["tiny"], seed=0), root / "data")
    return root


def test_short_train_base_lowers_loss_and_writes_a_checkpoint(tiny_data):
    out = tiny_data / "base"
    result = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(out), **{**BASE_PRESETS["tiny"], "steps": 60}))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 60
    first = sum(r["loss"] for r in records[:5]) / 5
    last = sum(r["loss"] for r in records[-5:]) / 5
    assert last < 0.8 * first
    assert math.isfinite(result["val_nll"]) and "log_consistent_at_t0" in result
    ckpt = load_checkpoint(out)
    assert ckpt.fingerprint == result["fingerprint"]
    assert ckpt.model.cfg.block_size >= max(2 * 5 + 6 + 2 + 4, 0)  # longest tiny sequence + latent slots


def test_same_seed_same_fingerprint(tiny_data, tmp_path):
    kw = {**BASE_PRESETS["tiny"], "steps": 5}
    a = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "a"), **kw))
    b = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "b"), **kw))
    c = run(BaseTrainConfig(data=str(tiny_data / "data"), out=str(tmp_path / "c"), **{**kw, "seed": 1}))
    assert a["fingerprint"] == b["fingerprint"] != c["fingerprint"]


def test_consistent_at_t0_matches_enumeration():
    from pipeline.synth import generate

    cfg = PRESETS["tiny"]
    for s in list(generate(cfg, "val"))[:50]:
        n = consistent_at_t0(s, cfg)
        if s.t0 >= len(s.y) + 1:
            assert n is None
        else:
            assert 2 <= n <= len(cfg.strategies)  # one left before t0 would have made t0 earlier
