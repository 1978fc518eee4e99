"""A split the store does not hold: eval scores it with the baseline checkpoint and says so;
train refuses before its first step and prints the command that fills the gap."""

import json
import shutil

import pytest

from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.loop.train import run as train
from tokweight.training.config.train import IOConfig, LogConfig, OptimConfig, TrainConfig


def partial_store(tiny, root, splits=("train", "val")):
    """A store extracted over some splits only (a store matches shards by content, wherever they lie)."""
    data, ckpt = tiny
    for split in splits:
        shutil.copytree(data / split, root / "some" / split)
    extract(ExtractConfig(checkpoint=str(ckpt), data=str(root / "some"), store=str(root / "store"), progress=False,
                          reader_process=False))
    return root / "store"


def test_eval_on_an_unextracted_split_uses_the_frozen_baseline_and_matches_the_store(tiny, tmp_path):
    data, ckpt = tiny
    store = partial_store(tiny, tmp_path)
    train(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), store=str(store), out=str(tmp_path / "run"),
                               num_workers=0),
                      optim=OptimConfig(steps=2, batch_size=8), log=LogConfig(grad_diag_every=0)))
    cfg = EvalConfig(run=str(tmp_path / "run"), data=str(data), split="test", decode_examples=0)
    fallback = run_eval(cfg)
    assert fallback["baseline"]["policy"] == "frozen"
    assert "test/shard-000000.tar" in fallback["baseline"]["reason"]
    command = fallback["baseline"]["extract_command"]
    assert command == f"tokweight extract --checkpoint {ckpt} --data {data} --store {store}"
    extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), progress=False,
                          reader_process=False))  # what the command does
    stored = run_eval(cfg)
    assert stored["baseline"] == {"policy": "precomputed", "store": str(store)}
    assert stored["metrics"].keys() == fallback["metrics"].keys()
    for name in ("recon", "recon_uniform", "kl"):
        assert stored["metrics"][name] == pytest.approx(fallback["metrics"][name], abs=1e-5), name
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["baseline"]["policy"] == "precomputed"


def test_train_without_the_val_split_in_the_store_stops_before_training(tiny, tmp_path):
    data, ckpt = tiny
    store = partial_store(tiny, tmp_path, splits=("train",))
    with pytest.raises(ValueError, match=r"val/shard-000000.tar.*add them with: tokweight extract --checkpoint"):
        train(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), store=str(store),
                                   out=str(tmp_path / "run"), num_workers=0),
                          optim=OptimConfig(steps=2, batch_size=8)))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
