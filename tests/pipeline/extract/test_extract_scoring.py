"""Stored b against references: an unbatched float64 loop, transformers' GPT-2, and itself under any batching."""

import copy
import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokweight.pipeline.data.bucketing import bucket, padded_fraction, plan_batches
from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.extract.prepare import ShardBatches, encode, read_samples
from tokweight.pipeline.extract.score import score_batch, score_shard
from tokweight.pipeline.data.shards import resolve_shards, shard_name
from tokweight.pipeline.tokens.templates import Layout, collate, template_ids
from tokweight.store.baseline_store import BaselineStore
from tokweight.training.export.checkpoint import export_hf


def zfree(vocab, x, y, **kw) -> list[int]:
    """The z-free template's ids."""
    return template_ids(vocab, x, y, **kw)[0]

TOL = 1e-5


def _first_train_shard(world):
    root, paths = resolve_shards(world.data)
    path = [p for p in paths if shard_name(root, p).startswith("train/")][0]
    return path, shard_name(root, path)


def _reference(logits_fn, vocab, sample):
    """Per-example, unpadded: (b, entropy, argmax) over S from full-sequence logits, float64."""
    ids = zfree(vocab, sample.x, sample.y)
    lay = Layout(len(sample.x), len(sample.y))
    logits = logits_fn(torch.tensor([ids])).double()[0]  # (L, V)
    log_p = logits.log_softmax(-1)[list(lay.s_logit_positions())]  # (T, V)
    targets = torch.tensor([ids[p] for p in lay.s_positions()])
    b = -log_p.gather(1, targets[:, None])[:, 0]
    return b.numpy(), -(log_p.exp() * log_p).sum(-1).numpy(), log_p.argmax(-1).numpy() == targets.numpy()


def test_b_equals_unbatched_float64(world):
    ckpt = load_checkpoint(world.ckpt)
    model64 = copy.deepcopy(ckpt.model).double()
    path, name = _first_train_shard(world)
    view = BaselineStore(world.store).open()
    rows = view.rows_for_shard(path)
    table = view.read_part(view.input_for_shard(path)["part"])
    entropy = dict(zip(table.column("key").to_pylist(), table.column("entropy").to_pylist()))
    top1 = dict(zip(table.column("key").to_pylist(), table.column("top1").to_pylist()))
    samples = list(read_samples(path, name, None))
    assert list(rows) == [s.key for s in samples]  # rows in shard order
    with torch.no_grad():
        for sample in samples:
            b, h, hit = _reference(lambda idx: model64(idx)[0], ckpt.vocab, sample)
            row = rows[sample.key]
            assert row["T"] == len(sample.y) + 1 and row["b"].dtype == np.float32
            np.testing.assert_allclose(row["b"], b, rtol=0, atol=TOL)
            np.testing.assert_allclose(entropy[sample.key], h, rtol=0, atol=TOL)
            assert top1[sample.key] == hit.tolist()
            assert row["target_id"].tolist() == zfree(ckpt.vocab, sample.x, sample.y)[-len(b) - 1:-1]


def _scores_by_key(ckpt, samples, shard, batch_tokens):
    encoded = list(encode(samples, ckpt.vocab, ckpt.model.cfg.block_size, shard, None))
    rows = ShardBatches.build(shard, encoded, batch_tokens)
    return score_shard(rows, ckpt.model, torch.device("cpu"), lambda n: None)


@pytest.mark.parametrize("batch_tokens", [1, 37, 100_000])
def test_b_invariant_to_batch_size_and_bucketing(world, batch_tokens):
    ckpt = load_checkpoint(world.ckpt)
    path, name = _first_train_shard(world)
    samples = list(read_samples(path, name, None))
    reference = BaselineStore(world.store).open().rows_for_shard(path)
    table = _scores_by_key(ckpt, samples, name, batch_tokens)
    assert table.column("key").to_pylist() == [s.key for s in samples]  # order restored after bucketing
    for key, b in zip(table.column("key").to_pylist(), table.column("b").to_pylist()):
        np.testing.assert_allclose(b, reference[key]["b"], rtol=0, atol=TOL)


def test_b_invariant_to_padding_and_mixed_lengths(world):
    ckpt = load_checkpoint(world.ckpt)
    path, name = _first_train_shard(world)
    samples = list(read_samples(path, name, None))[:24]
    reference = BaselineStore(world.store).open().rows_for_shard(path)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(samples))  # unbucketed: lengths mixed inside the batch
    seqs = [zfree(ckpt.vocab, samples[i].x, samples[i].y) for i in order]
    layouts = [Layout(len(samples[i].x), len(samples[i].y)) for i in order]
    batch = collate(seqs, layouts, pad_to=ckpt.model.cfg.block_size)  # padded to the full context
    b_n, _, _ = score_batch(ckpt.model, batch)
    assert b_n.shape == (sum(layout.T for layout in layouts),)  # one value per S position, none for padding
    b = torch.zeros(batch.mask.shape).masked_scatter(batch.mask, b_n)  # (B, T_max), row-major like the mask
    for row, i in enumerate(order):
        T = layouts[row].T
        np.testing.assert_allclose(b[row, :T].numpy(), reference[samples[i].key]["b"], rtol=0, atol=TOL)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_b_equals_transformers_gpt2(world, tmp_path):
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(export_hf(world.ckpt, tmp_path / "hf")).eval()
    vocab = load_checkpoint(world.ckpt).vocab
    path, name = _first_train_shard(world)
    rows = BaselineStore(world.store).open().rows_for_shard(path)
    with torch.no_grad():
        for sample in list(read_samples(path, "train", None))[:32]:
            b, _, _ = _reference(lambda idx: hf(idx).logits, vocab, sample)
            np.testing.assert_allclose(rows[sample.key]["b"], b, rtol=0, atol=TOL)


# ---------------------------------------------------------------- bucketing


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 64), max_size=200), st.integers(1, 512))
def test_plan_batches_covers_each_index_once_within_budget(lengths, batch_tokens):
    batches = plan_batches(lengths, batch_tokens)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= batch_tokens


def test_bucketing_keeps_padding_small_on_synthetic_lengths():
    lengths = np.random.default_rng(0).integers(20, 45, size=2000).tolist()
    batches = plan_batches(lengths, 4096)
    assert padded_fraction(lengths, batches) <= 0.05
    unbucketed = [list(range(i, min(i + 100, 2000))) for i in range(0, 2000, 100)]  # same batch size, input order
    assert padded_fraction(lengths, unbucketed) > 0.2
    assert list(bucket(["aa", "b", "ccc"], 4, len)) == [["b", "aa"], ["ccc"]]
