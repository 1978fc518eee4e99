"""Each class of bad input under both policies: 'error' names shard and key and commits nothing;
'skip' leaves the sample out, counts it per reason, and keeps the other rows in order."""


import pytest
import torch

from pipeline.checkpoint import load_checkpoint, save_checkpoint
from pipeline.errors import SampleError
from pipeline.extract import run, tar_keys
from store.baseline_store import BaselineStore
from tests.fixtures_extract import fp_dir, sample_member, write_raw_tar

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
