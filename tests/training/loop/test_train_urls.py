"""Training, evaluation and the other stages over URLs: splits by URL prefix, dataset.json from the URL root, the
same batches and b as from disk, and a shard whose bytes changed since its part was written refused by URL."""

import json
import shutil
from dataclasses import replace
from itertools import islice

import pytest
import torch
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.pipeline.data.labels import load_labels
from tokweight.pipeline.data.shards import dataset_json, resolve_shards
from tokweight.pipeline.extract.config import Retry
from tokweight.training.loop.batches import StreamSpec, TrainBatch
from tokweight.training.loop.join import StoreMismatchError, StoreRef
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.loop.stream import EvalStream, TrainStream

from tests.support.http_shards import ShardServer

NOW = Retry(attempts=2, backoff_s=0)
PATTERN = "{train/shard-{000000..000003},val/shard-000000,test/shard-000000}.tar"


@pytest.fixture
def served(tiny, tmp_path):
    """(server, data pattern, store extracted over HTTP) on a copy of the tiny data (a test may change it)."""
    shutil.copytree(tiny[0], tmp_path / "data")
    with ShardServer(tmp_path / "data") as server:
        data = server.url(PATTERN)
        extract(ExtractConfig(checkpoint=str(tiny[1]), data=data, store=str(tmp_path / "store"), progress=False,
                              reader_process=False, retry=NOW))
        yield server, data, tmp_path / "store"


def spec_of(tiny, data, store, split="train", **kw) -> StreamSpec:
    ckpt = load_checkpoint(tiny[1])
    return StreamSpec(urls=split_urls(data, split), vocab=ckpt.vocab, slots=1, block_size=ckpt.model.cfg.block_size,
                      batch_size=8, store=StoreRef(str(store), ckpt.fingerprint), seed=5, shuffle_buffer=32,
                      root=str(data), retry=NOW, **kw)


def test_splits_are_url_prefixes_and_dataset_json_sits_at_the_root(tiny, tmp_path):
    with ShardServer(tiny[0]) as server:
        data = server.url(PATTERN)
        assert resolve_shards(data)[0] == server.base
        assert split_urls(data, "train") == tuple(server.url(f"train/shard-00000{i}.tar") for i in range(4))
        assert split_urls(data, "val") == (server.url("val/shard-000000.tar"),)
        with pytest.raises(ValueError, match="has no split 'dev': its splits are train, val, test"):
            split_urls(data, "dev")
        listing = tmp_path / "urls.txt"
        listing.write_text("\n".join(resolve_shards(data)[1]) + "\n")
        assert split_urls(str(listing), "test") == (server.url("test/shard-000000.tar"),)
        assert load_labels(data) == load_labels(tiny[0]) and load_labels(data).strategies
        one_split = server.url("train/shard-{000000..000001}.tar")
        assert split_urls(one_split, "val") == split_urls(one_split, "train")  # no folders: every split at once
        assert dataset_json(one_split) is None and load_labels(one_split).source == "unknown"  # a 404: not there
    pipe = f"pipe:cat {tiny[0]}/{PATTERN}"
    assert split_urls(pipe, "val") == (f"pipe:cat {tiny[0]}/val/shard-000000.tar",)
    assert dataset_json(pipe) == json.loads((tiny[0] / "dataset.json").read_text())


@pytest.mark.parametrize("workers", [0, 1])
def test_streams_over_http_give_the_batches_and_b_of_disk(tiny, tiny_store, served, workers):
    server, data, store = served
    local = spec_of(tiny, str(tiny[0]), tiny_store)
    remote = spec_of(tiny, data, store)
    batches = [list(islice(TrainStream(spec, 0, 1).batches(workers), 6)) for spec in (local, remote)]
    for a, b in zip(*batches):
        assert a.keys == b.keys and torch.equal(a.b, b.b) and torch.equal(a.zcond.input_ids, b.zcond.input_ids)
    evaluated = [[batch.keys for batch in EvalStream(replace(spec, urls=split_urls(spec.root, "val")))
                  if isinstance(batch, TrainBatch)] for spec in (local, remote)]
    assert evaluated[0] == evaluated[1] and evaluated[0]


def test_a_shard_whose_bytes_changed_since_extraction_is_refused_naming_its_url(tiny, served, tmp_path):
    server, data, store = served
    shard = tmp_path / "data" / "train" / "shard-000001.tar"
    shard.write_bytes((shard.parent / "shard-000000.tar").read_bytes())  # other samples at the same URL
    spec = spec_of(tiny, data, store)
    with pytest.raises(StoreMismatchError) as failed:
        list(islice(TrainStream(replace(spec, urls=spec.urls[1:2]), 0, 1).batches(0), 1))
    message = str(failed.value)
    assert f"shard {server.url('train/shard-000001.tar')} changed since its part was written" in message
    assert "\n" not in message and "extract a fresh store" in message


def test_train_base_train_and_eval_take_urls(tiny, served, tmp_path):
    server, data, store = served
    server.requests.clear()
    base = CliRunner().invoke(main, ["train-base", "--data", data, "--out", str(tmp_path / "base"), "--preset", "tiny",
                                     "--steps", "2"])
    assert base.exit_code == 0, base.output
    assert server.requests["train/shard-000003.tar"] == server.requests["val/shard-000000.tar"] == 1
    assert server.requests["dataset.json"] >= 1 and not server.requests["test/shard-000000.tar"]
    run = str(tmp_path / "run")
    trained = CliRunner().invoke(main, ["train", "--checkpoint", str(tiny[1]), "--data", data, "--store", str(store),
                                        "--out", run, "--steps", "2", "--batch-size", "4", "--num-workers", "0"])
    assert trained.exit_code == 0, trained.output
    evaluated = CliRunner().invoke(main, ["eval", "--run", run, "--data", data, "--split", "test",
                                          "--decode-examples", "4"])
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["baseline"]["policy"] == "precomputed"
    assert server.requests["test/shard-000000.tar"] >= 1
    encoded = CliRunner().invoke(main, ["encode", "--run", run, "--data", data, "--split", "val"])
    assert encoded.exit_code == 0, encoded.output


def test_the_experiment_splits_urls_and_keys_them_by_the_content_the_store_streamed(tiny, served):
    from tokweight.experiments.artefacts import data_key
    from tokweight.experiments.own_task.inputs import content_key, dataset, split_shards

    server, data, store = served
    assert dataset(data) == data and dataset(str(tiny[0])) == tiny[0]
    shards = split_shards(dataset(data))
    assert shards["test"] == [server.url("test/shard-000000.tar")] and len(shards["train"]) == 4
    fingerprint = load_checkpoint(tiny[1]).fingerprint
    assert content_key(data, shards, store, fingerprint) == data_key(tiny[0], split_shards(tiny[0]))
    with pytest.raises(ValueError, match=r"has no 'val' split with shards \(http://.*/val/\)"):
        split_shards(server.url("{train,test}/shard-000000.tar"))


def test_ground_truth_for_inspect_is_read_from_urls(tiny, tiny_store, served):
    from tokweight.pipeline.data.labels import ground_truth_from_data

    server, data, store = served
    over_http = ground_truth_from_data(store, [], data)
    assert over_http.num_rows == 768 and over_http.equals(ground_truth_from_data(tiny_store, [], str(tiny[0])))
