"""The store join: precomputed b is the frozen model's b, is really consumed, and every mismatch raises."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint, save_checkpoint
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.data.shards import iter_samples, write_shards
from tokweight.store.baseline_store import BaselineStore
from tokweight.training.objective.baselines import Frozen
from tokweight.training.cvae.model import CVAEConfig, build_cvae
from tokweight.training.objective.loss import plain_objective, reconstruction
from tokweight.training.loop.batches import collate_examples, encode
from tokweight.training.loop.join import REMEDY, BadSamples, StoreMismatchError, StoreRef, join_store, stored_shard
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.objective.terms import WeightingParams, reconstruction_weights
from tokweight.training.loop.train import run
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig
from tokweight.store.manifest import write_checked_json


class EditedView:
    """A real StoreView whose rows go through ``edit(key, row) -> row`` (None drops the row)."""

    def __init__(self, view, edit):
        self.view, self.edit = view, edit

    def __getattr__(self, name):
        return getattr(self.view, name)

    def rows_for_shard(self, url):
        rows = {k: self.edit(k, dict(r)) for k, r in self.view.rows_for_shard(url).items()}
        return {k: r for k, r in rows.items() if r is not None}


def joined_batch(tiny, store, edit=lambda k, r: r, n=24):
    data, ckpt_dir = tiny
    ckpt = load_checkpoint(ckpt_dir)
    ref = StoreRef(str(store), ckpt.fingerprint)
    view = EditedView(ref.open(ckpt.vocab), edit)
    url = split_urls(data, "train")[0]
    items = list(iter_samples([url]))[:n]
    joined = join_store(items, stored_shard(view, url, ref.fingerprint), BadSamples(url, "error"))
    examples = encode(joined, ckpt.vocab, 1, ckpt.model.cfg.block_size, (view.fingerprint, ref.fingerprint))
    return ckpt, collate_examples(list(examples))


def test_stored_b_is_the_frozen_models_b(tiny, tiny_store):
    ckpt, batch = joined_batch(tiny, tiny_store)
    torch.testing.assert_close(batch.b, Frozen(ckpt.model)(batch), atol=1e-5, rtol=0)
    assert (batch.b[~batch.zfree.mask] == 0).all()


def test_precomputed_and_frozen_give_the_same_loss_at_every_step(tiny, tiny_store, tmp_path):
    data, ckpt = tiny
    losses = {}
    for policy in ("precomputed", "frozen"):
        cfg = TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), store=str(tiny_store),
                                   out=str(tmp_path / policy), num_workers=0),
                          loss=LossConfig(policy=policy), optim=OptimConfig(steps=5, batch_size=8),
                          log=LogConfig(log_every=1, grad_diag_every=0))
        run(cfg)
        recs = [json.loads(x) for x in (tmp_path / policy / "metrics.jsonl").read_text().splitlines()]
        losses[policy] = [r["loss"] for r in recs if "loss" in r]
    assert len(losses["frozen"]) == 5
    np.testing.assert_allclose(losses["precomputed"], losses["frozen"], atol=1e-5, rtol=0)


def test_poisoned_b_changes_the_loss(tiny, tiny_store):
    def poison(key, row):
        return {**row, "b": row["b"][::-1].copy()}  # same values, other tokens

    ckpt, clean = joined_batch(tiny, tiny_store)
    _, poisoned = joined_batch(tiny, tiny_store, poison)
    torch.manual_seed(0)
    model = build_cvae(ckpt.model, ckpt.vocab, CVAEConfig(k=2)).eval()
    out = model(clean)
    loss = {}
    for name, batch in (("clean", clean), ("poisoned", poisoned)):
        pi, _ = reconstruction_weights("surprisal-share", batch.b, batch.zfree.mask, WeightingParams())
        loss[name] = plain_objective(model.latent, out, reconstruction(out, pi), beta=1.0).loss.item()
    assert abs(loss["clean"] - loss["poisoned"]) > 1e-3


def nan_in_b(key, row):
    """Row edit: one NaN in the b of a key that the first 24 samples do not reach."""
    if key != "train-0000100":
        return row
    b = row["b"].copy()
    b[0] = np.nan
    return {**row, "b": b}


@pytest.mark.parametrize("edit, match", [
    (lambda k, r: None if k.endswith("3") else r, "has no row"),
    (lambda k, r: {**r, "T": r["T"] + 1}, "stored T="),
    (lambda k, r: {**r, "target_id": r["target_id"][::-1].copy()}, "stored S token ids"),
    (lambda k, r: {**r, "target_id": r["target_id"][:-1]}, "stored S token ids"),
    (lambda k, r: {**r, "b": r["b"][:-1]}, "stored b has shape"),
    (nan_in_b, "key 'train-0000100' .* holds NaN or inf"),
])
def test_each_row_mismatch_raises_naming_key_shard_fingerprints_and_remedy(tiny, tiny_store, edit, match):
    with pytest.raises(StoreMismatchError, match=match) as info:
        joined_batch(tiny, tiny_store, edit)
    msg = str(info.value)
    assert "key 'train-" in msg and "shard-000000.tar" in msg and "fingerprint" in msg and REMEDY in msg


def test_the_join_reads_the_same_rows_from_a_zarr_store(tiny, tiny_store, tmp_path):
    data, ckpt_dir = tiny
    zarr_store = tmp_path / "zarr"
    extract(ExtractConfig(checkpoint=str(ckpt_dir), data=str(data / "train"), store=str(zarr_store), format="zarr",
                          progress=False, reader_process=False))
    url = split_urls(data, "train")[0]
    parquet, zarr = (BaselineStore(store).open().rows_for_shard(url) for store in (tiny_store, zarr_store))
    assert list(parquet) == list(zarr)
    for key, row in parquet.items():
        assert row["T"] == zarr[key]["T"] and row["b"].dtype == zarr[key]["b"].dtype == np.float32
        np.testing.assert_array_equal(row["b"], zarr[key]["b"])
        np.testing.assert_array_equal(row["target_id"], zarr[key]["target_id"])


def test_store_of_another_checkpoint_is_refused(tiny, tiny_store, tmp_path):
    data, ckpt_dir = tiny
    ckpt = load_checkpoint(ckpt_dir)
    with torch.no_grad():
        ckpt.model.wte.weight[0, 0] += 1.0
    other = tmp_path / "other"
    other_fp = save_checkpoint(other, ckpt.model, ckpt.vocab)
    cfg = TrainConfig(IOConfig(checkpoint=str(ckpt_dir), data=str(data), store=str(tiny_store),
                               out=str(tmp_path / "run"), baseline_checkpoint=str(other), num_workers=0),
                      optim=OptimConfig(steps=2))
    with pytest.raises(StoreMismatchError) as info:
        run(cfg)
    assert other_fp in str(info.value) and load_checkpoint(ckpt_dir).fingerprint in str(info.value)


def test_changed_shard_and_incomplete_store_are_refused(tiny, tiny_store, tmp_path):
    data, ckpt_dir = tiny
    ckpt = load_checkpoint(ckpt_dir)
    ref = StoreRef(str(tiny_store), ckpt.fingerprint)
    changed = [replace(s, y=s.y[::-1]) for _, s in iter_samples(split_urls(data, "train")[:1])]
    [shard] = write_shards(changed, tmp_path / "changed", shard_size=1000)
    with pytest.raises(StoreMismatchError, match="shard .*shard-000000.tar has no part"):
        stored_shard(ref.open(ckpt.vocab), str(shard), ref.fingerprint)
    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    manifest = next(copy.glob("fingerprint=*/manifest.json"))
    write_checked_json(manifest, {**json.loads(manifest.read_text()), "complete": False})  # a valid, incomplete one
    with pytest.raises(StoreMismatchError, match="incomplete"):
        StoreRef(str(copy), ckpt.fingerprint).open(ckpt.vocab)
