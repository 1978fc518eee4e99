"""One skip policy across stages: what `extract --on-bad-sample skip` left out, train and eval leave out
too (read from the manifest) and count, never crash; a bad sample the store does not record stops the
stream naming its real key and the shard, relative to the dataset root, from a loader worker as well."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.cli import main
from tokweight.pipeline.data.errors import Skips
from tokweight.pipeline.extract.config import ExtractConfig
from tokweight.pipeline.extract.extract import run as extract
from tokweight.store.baseline_store import BaselineStore
from tests.support.fixtures_extract import sample_member, write_raw_tar
from tokweight.training.loop.batches import StreamSpec, kept_samples
from tokweight.training.loop.join import StoreRef
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.loop.stream import EvalStream, TrainStream, shard_decoder

GOOD = {"x": ["a", "b"], "y": ["c", "d", "e"], "strategy": "copy", "t0": 1}


def good(prefix: str, n: int) -> list[tuple[str, bytes]]:
    return [sample_member(f"{prefix}{i}", {**GOOD, "x": ["a", "b", "c", "d"][: 1 + i % 4]}) for i in range(n)]


def truncated(path, members):
    write_raw_tar(path, members)
    path.write_bytes(path.read_bytes()[:1536])  # the first sample complete, the second cut off


def extract_skipping(ckpt, data, store):
    extract(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), on_bad_sample="skip",
                          progress=False, reader_process=False))
    return store


@pytest.fixture(scope="module")
def dotted(tiny, tmp_path_factory):
    """(data, store): one shard per split, each with a dotted key (WebDataset merges it into 'doc'),
    extracted under 'skip'."""
    data = tmp_path_factory.mktemp("dotted") / "data"
    for split, n, key in (("train", 12, "doc.v1.0001"), ("val", 8, "doc.v1.0002"), ("test", 8, "doc.v1.0003")):
        members = good(f"{split}-", n)
        write_raw_tar(data / split / "shard-000000.tar", members[:3] + [sample_member(key, GOOD)] + members[3:])
    return data, extract_skipping(tiny[1], data, data.parent / "store")


@pytest.fixture(scope="module")
def mixed(tiny, tmp_path_factory):
    """(data, store): train/ holds a dotted key, a key in two shards and a truncated shard, extracted under 'skip'."""
    data = tmp_path_factory.mktemp("mixed") / "data"
    write_raw_tar(data / "train" / "shard-000000.tar", good("a", 6) + [sample_member("twin", GOOD),
                                                                       sample_member("doc.v1.0001", GOOD)])
    write_raw_tar(data / "train" / "shard-000001.tar", good("b", 6) + [sample_member("twin", GOOD)])
    truncated(data / "train" / "shard-000002.tar", good("c", 4))
    return data, extract_skipping(tiny[1], data, data.parent / "store")


def spec_of(tiny, data, split, store=None, **kw) -> StreamSpec:
    ckpt = load_checkpoint(tiny[1])
    ref = None if store is None else StoreRef(str(store), ckpt.fingerprint)
    return StreamSpec(urls=split_urls(data, split), vocab=ckpt.vocab, slots=1, block_size=ckpt.model.cfg.block_size,
                      batch_size=4, store=ref, root=str(data), **kw)


def eval_pass(spec: StreamSpec) -> tuple[int, Skips]:
    """(examples, skips) of one EvalStream pass."""
    examples, skips = 0, Skips()
    for item in EvalStream(spec):
        if isinstance(item, Skips):
            skips.merge(item)
        else:
            examples += len(item)
    return examples, skips


def test_train_and_eval_skip_and_count_what_extract_skipped(tiny, dotted, tmp_path):
    data, store = dotted
    run_dir = str(tmp_path / "run")
    train = CliRunner().invoke(main, ["train", "--checkpoint", str(tiny[1]), "--data", str(data), "--store", str(store),
                                      "--out", run_dir, "--steps", "2", "--batch-size", "4", "--num-workers", "1"])
    assert train.exit_code == 0, train.output
    assert ("skipped 2 samples: bad-key 2 (shards train/shard-000000.tar, val/shard-000000.tar)"
            in train.stderr.splitlines())
    result = json.loads(train.stdout)
    assert result["examples"] == 8 and result["skipped"] == {"bad-key": 2}
    assert result["skipped_shards"] == {"train/shard-000000.tar": {"bad-key": 1},
                                        "val/shard-000000.tar": {"bad-key": 1}}
    # eval's decode samples are read by training/evaluation/evaluate.py without the stream's policy: decode none here
    evaluated = CliRunner().invoke(main, ["eval", "--run", run_dir, "--data", str(data), "--split", "test",
                                          "--decode-examples", "0"])
    assert evaluated.exit_code == 0, evaluated.output
    assert "skipped 1 sample: bad-key 1 (shard test/shard-000000.tar)" in evaluated.stderr.splitlines()
    metrics = json.loads((tmp_path / "run" / "eval.json").read_text())["metrics"]
    assert metrics["examples"] == 8 and metrics["skipped"] == {"bad-key": 1}
    assert metrics["skipped_shards"] == {"test/shard-000000.tar": {"bad-key": 1}}
    md = (tmp_path / "run" / "eval.md").read_text()  # the command renders eval.md from the result and prints it
    assert md.startswith("## Verdict\n\n") and md in evaluated.stdout


def test_without_a_store_a_dotted_key_stops_train_naming_it_and_its_shard(tiny, dotted, tmp_path):
    data, _ = dotted
    result = CliRunner().invoke(main, ["train", "--checkpoint", str(tiny[1]), "--data", str(data), "--policy", "frozen",
                                       "--out", str(tmp_path / "run"), "--steps", "2", "--batch-size", "4",
                                       "--num-workers", "1"])
    assert result.exit_code == 1
    assert "key 'doc.v1.0001'" in result.stderr and "shard 'train/shard-000000.tar'" in result.stderr
    assert "Traceback" not in result.output and "key 'doc'" not in result.output


def test_the_streams_own_skip_policy_counts_bad_samples_without_a_store(tiny, dotted):
    examples, skips = eval_pass(spec_of(tiny, dotted[0], "test", on_bad_sample="skip"))
    assert examples == 8 and skips.shards == {"test/shard-000000.tar": {"bad-key": 1}}


def test_every_stream_skips_exactly_what_the_manifest_records(tiny, mixed):
    data, store = mixed
    manifest = BaselineStore(store).open().manifest
    recorded = {"train/shard-000000.tar": {"bad-key": 1}, "train/shard-000001.tar": {"duplicate-key": 1},
                "train/shard-000002.tar": {"truncated-shard": 1}}
    assert {p["input"]: p["skipped"] for p in manifest["parts"] if p["skipped"]} | {
        e["name"]: {e["skipped"]: 1} for e in manifest["inputs"] if e["part"] is None} == recorded
    spec = spec_of(tiny, data, "train", store)
    examples, skips = eval_pass(spec)
    assert examples == 6 + 1 + 6 and skips.shards == recorded  # twin kept in the first shard only
    decode = shard_decoder(spec)  # the training stream's per-shard stage
    decoded = [decode(0, url) for url in spec.urls]
    assert [d.error for d in decoded] == [None] * 3 and {d.shard: d.skipped for d in decoded} == recorded
    assert "twin" not in {ex.key for ex in decoded[1].examples}
    kept = [ex.key for d in decoded for ex in d.examples]
    assert [s.key for s in kept_samples(spec, 100)] == kept and len(kept_samples(spec, 3)) == 3  # what eval decodes


def test_a_lane_of_shards_skipped_whole_stops_the_training_stream(tiny, mixed):
    data, store = mixed
    spec = replace(spec_of(tiny, data, "train", store), urls=split_urls(data, "train")[2:])
    with pytest.raises(ValueError, match="every shard of lane 0 .*truncated-shard 1"):
        next(TrainStream(spec, 0, 1).batches(0))
