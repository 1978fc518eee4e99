"""Each class of bad input under both policies: 'error' names shard and key and commits nothing;
'skip' leaves the sample out, counts it per reason, records its key, and keeps the other rows in order.
Keys are unique across the shards of a run, and what a run skipped is said on stderr."""

import json

import pytest
import torch
from click.testing import CliRunner

from tokweight.pipeline.models.checkpoint import load_checkpoint, save_checkpoint
from tokweight.cli import main
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.extract.extract import run
from tokweight.pipeline.extract.plan import cross_shard_duplicates, make_plan, skip_duplicates
from tokweight.pipeline.data.shards import tar_keys
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.writer import hash_inputs
from tests.support.fixtures_extract import fp_dir, sample_member, write_raw_tar

GOOD = {"x": ["a", "b"], "y": ["c", "d", "e"], "strategy": "copy", "t0": 1}

# reason -> the members that replace the good sample "k1" (between k0 and k2)
BAD = {
    "missing-field": [sample_member("k1", {"x": ["a"]})],
    "wrong-type": [sample_member("k1", {"x": ["a"], "y": "cde"})],
    "unknown-symbol": [sample_member("k1", {"x": ["a"], "y": ["c", "zz"]})],
    "empty-y": [sample_member("k1", {"x": ["a"], "y": []})],
    "too-long": [sample_member("k1", {"x": ["a"] * 40, "y": ["b"]})],
    "bad-json": [sample_member("k1", b"{not json")],
    "bad-key": [sample_member("k.1", GOOD)],
    "duplicate-key": [sample_member("k1", GOOD), sample_member("k2x", GOOD), sample_member("k1", GOOD)],
}


def _data(tmp_path, members):
    """bad/shard.tar (k0, the bad members, k2) and good/shard.tar, which sorts after it."""
    write_raw_tar(tmp_path / "data" / "bad" / "shard.tar",
                  [sample_member("k0", GOOD), *members, sample_member("k2", GOOD)])
    write_raw_tar(tmp_path / "data" / "good" / "shard.tar", [sample_member(f"g{i}", GOOD) for i in range(3)])
    return tmp_path / "data"


@pytest.mark.parametrize("reason", sorted(BAD))
def test_error_policy_names_shard_and_key_and_commits_nothing(world, tmp_path, reason):
    data = _data(tmp_path, BAD[reason])
    with pytest.raises(SampleError) as info:
        run(world.config(tmp_path / "s", data=str(data)))
    assert info.value.reason == reason
    assert "bad/shard.tar" in str(info.value) and ("'k.1'" if reason == "bad-key" else "'k1'") in str(info.value)
    directory = fp_dir(tmp_path / "s")
    assert not (directory / "manifest.json").exists()
    assert not list(directory.glob("part-00000*"))  # the bad shard's part never appears
    assert BaselineStore(tmp_path / "s").fingerprints() == []


@pytest.mark.parametrize("reason", sorted(BAD))
def test_skip_policy_counts_per_reason(world, tmp_path, reason):
    data = _data(tmp_path, BAD[reason])
    summary = run(world.config(tmp_path / "s", data=str(data), on_bad_sample="skip"))
    view = BaselineStore(tmp_path / "s").open()
    assert summary["skipped"] == view.manifest["skipped"] == {reason: 1}
    part = view.parts()[0]
    assert part["input"] == "bad/shard.tar" and part["skipped"] == {reason: 1}
    assert part["skipped_keys"] == {reason: ["k.1" if reason == "bad-key" else "k1"]}  # what training skips too
    assert "skipped_keys" not in view.parts()[1]  # a part without skips is written as before
    keys = view.read_part(part["name"]).column("key").to_pylist()
    assert keys == (["k0", "k1", "k2x", "k2"] if reason == "duplicate-key" else ["k0", "k2"])
    samples = {e["name"]: e["samples"] for e in view.manifest["inputs"]}
    assert samples == {"bad/shard.tar": 4 if reason == "duplicate-key" else 3, "good/shard.tar": 3}
    assert view.manifest["stats"]["rows"] == len(keys) + 3


def _truncated(tmp_path):
    data = _data(tmp_path, [sample_member("k1", GOOD)])
    path = data / "bad" / "shard.tar"
    path.write_bytes(path.read_bytes()[:1536])  # k0 complete, k1 cut off: a tar reader sees 1 sample
    return data


def test_truncated_tar_error_policy(world, tmp_path):
    with pytest.raises(SampleError, match="bad/shard.tar") as info:
        run(world.config(tmp_path / "s", data=str(_truncated(tmp_path))))
    assert info.value.reason == "truncated-shard"
    assert BaselineStore(tmp_path / "s").fingerprints() == []


def test_truncated_tar_is_never_a_short_shard(world, tmp_path):
    data = _truncated(tmp_path)
    run(world.config(tmp_path / "s", data=str(data), on_bad_sample="skip"))
    view = BaselineStore(tmp_path / "s").open()
    assert view.manifest["skipped"] == {"truncated-shard": 1}
    bad = [e for e in view.manifest["inputs"] if e["name"] == "bad/shard.tar"][0]
    assert bad["part"] is None and bad["skipped"] == "truncated-shard"
    assert [p["input"] for p in view.parts()] == ["good/shard.tar"]
    with pytest.raises(KeyError, match="truncated-shard"):
        view.rows_for_shard(data / "bad" / "shard.tar")
    assert run(world.config(tmp_path / "s", data=str(data), on_bad_sample="skip"))["nothing_to_do"]


def test_dotted_key_is_counted_not_merged():
    count, dotted = tar_keys(["k.json", "k.1.json", "m.txt", "__meta__"])
    assert count == 3 and dotted == {"k.1": "k"}


def test_non_finite_b_is_never_written(world, tmp_path):
    ckpt = load_checkpoint(world.ckpt)
    with torch.no_grad():
        ckpt.model.ln_f.bias[0] = float("nan")
    save_checkpoint(tmp_path / "nan", ckpt.model, ckpt.vocab)
    with pytest.raises(FloatingPointError, match="non-finite"):
        run(world.config(tmp_path / "s", checkpoint=str(tmp_path / "nan")))
    assert not list(fp_dir(tmp_path / "s").glob("part-*"))


def test_a_truncated_shard_skipped_whole_is_said_on_stderr_and_counted_like_store_ls(world, tmp_path):
    store = tmp_path / "s"
    args = ["extract", "--checkpoint", str(world.ckpt), "--data", str(_truncated(tmp_path)), "--store", str(store),
            "--on-bad-sample", "skip", "--no-progress", "--no-reader-process"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["skipped 1 whole shard: truncated-shard 1 (shard bad/shard.tar)"]
    summary = json.loads(result.stdout)
    listed = CliRunner().invoke(main, ["store", "ls", str(store)]).stdout
    assert summary["parts_written"] == summary["parts"] == 1 and "  parts=1  " in listed
    assert summary["skipped_shards"] == {"bad/shard.tar": {"truncated-shard": 1}}


def _twins(tmp_path):
    """train/shard-000000.tar and train/shard-000001.tar both hold a sample keyed 'twin'."""
    data = tmp_path / "data"
    write_raw_tar(data / "train" / "shard-000000.tar", [sample_member(k, GOOD) for k in ("a0", "twin", "a1")])
    write_raw_tar(data / "train" / "shard-000001.tar", [sample_member(k, GOOD) for k in ("b0", "twin", "b1")])
    return data


def test_a_key_in_two_shards_is_refused_naming_both(world, tmp_path):
    with pytest.raises(SampleError) as info:
        run(world.config(tmp_path / "s", data=str(_twins(tmp_path))))
    assert info.value.reason == "duplicate-key"
    assert "key 'twin' occurs in shards train/shard-000000.tar and train/shard-000001.tar" in str(info.value)
    assert BaselineStore(tmp_path / "s").fingerprints() == []


def test_a_key_in_two_shards_is_skipped_in_the_later_one(world, tmp_path):
    summary = run(world.config(tmp_path / "s", data=str(_twins(tmp_path)), on_bad_sample="skip"))
    view = BaselineStore(tmp_path / "s").open()
    first, later = view.parts()
    assert view.read_part(first["name"]).column("key").to_pylist() == ["a0", "twin", "a1"]
    assert view.read_part(later["name"]).column("key").to_pylist() == ["b0", "b1"]
    assert later["skipped"] == {"duplicate-key": 1} and later["skipped_keys"] == {"duplicate-key": ["twin"]}
    assert [e["samples"] for e in view.manifest["inputs"]] == [3, 3]  # the later twin is a sample of its tar
    assert summary["skipped_shards"] == {"train/shard-000001.tar": {"duplicate-key": 1}}


def test_the_key_check_is_one_plan_for_every_rank(tmp_path):
    """Rank 0 plans from every shard's names; the rank that writes the later shard gets its duplicates."""
    data = _twins(tmp_path)
    shards = hash_inputs({f"train/{p.name}": p for p in sorted((data / "train").iterdir())})
    tasks = skip_duplicates(make_plan(tmp_path / "store", shards, "parquet", 2).tasks,
                            cross_shard_duplicates(shards, "skip"))
    assert [(t.rank, t.duplicates) for t in tasks] == [(0, {}), (1, {"twin": "train/shard-000000.tar"})]


def test_a_store_without_skips_is_written_as_before(world):
    manifest = BaselineStore(world.store).open().manifest
    assert {tuple(sorted(p)) for p in manifest["parts"]} == {
        ("b_sum", "bytes", "input", "name", "rows", "sha256", "skipped", "sum_example_mean_b", "tokens")}
    assert {tuple(sorted(e)) for e in manifest["inputs"]} == {("name", "part", "samples", "sha256", "size")}
