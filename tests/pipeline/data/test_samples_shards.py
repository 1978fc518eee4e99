"""Sample validation and shard IO: error classes, round trip, truncation, duplicates."""

from __future__ import annotations

import io
import json
import tarfile
import warnings

import pytest

from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample, parse_sample, sample_to_json
from tokweight.pipeline.data.shards import (iter_samples, resolve_shards, shard_name, write_shards)


def samples_in(path) -> int:
    """The samples a shard yields (a damaged shard raises)."""
    return sum(1 for _ in iter_samples([str(path)]))


def _samples(n: int, prefix: str = "k") -> list[Sample]:
    return [Sample(key=f"{prefix}{i:03d}", x=tuple("abc"[: 1 + i % 3]), y=("b", "a") * (1 + i % 2),
                   strategy=None if i % 4 == 0 else "reverse", t0=None if i % 5 == 0 else i % 3)
            for i in range(n)]


def _raw(record, key="k1"):
    return {"__key__": key, "__url__": "s.tar", "json": json.dumps(record).encode()}


# ---------------------------------------------------------------- parse_sample


@pytest.mark.parametrize("raw, reason", [
    ({"__key__": "k1", "json": b"{not json"}, "bad-json"),
    (_raw({"y": ["a"]}), "missing-field"),
    (_raw({"x": ["a"]}), "missing-field"),
    ({"__key__": "k1", "txt": b"hello"}, "missing-field"),
    (_raw({"x": 3, "y": ["a"]}), "wrong-type"),
    (_raw({"x": ["a"], "y": ["a", 3]}), "wrong-type"),
    (_raw({"x": ["a"], "y": ["a"], "strategy": 1}), "wrong-type"),
    (_raw({"x": ["a"], "y": ["a"], "t0": True}), "wrong-type"),
    (_raw({"x": ["a"], "y": ["a"], "t0": 1.0}), "wrong-type"),
    (_raw([1, 2]), "wrong-type"),
    (_raw({"x": ["a"], "y": []}), "empty-y"),
    (_raw({"x": ["a"], "y": ["a"]}, key="a.b"), "bad-key"),
    (_raw({"x": ["a"], "y": ["a"]}, key="dir/k1"), "bad-key"),
])
def test_parse_sample_error_classes_name_key_and_shard(raw, reason):
    with pytest.raises(SampleError) as info:
        parse_sample(raw, shard="train/shard-000003.tar")
    err = info.value
    assert err.reason == reason
    assert err.key == raw["__key__"] and err.shard == "train/shard-000003.tar"
    assert raw["__key__"] in str(err) and "train/shard-000003.tar" in str(err)


def test_parse_sample_accepts_bytes_and_decoded_dict():
    record = {"x": ["a", "b"], "y": ["b", "a"], "strategy": "reverse", "t0": 0}
    expected = Sample("k1", ("a", "b"), ("b", "a"), "reverse", 0)
    assert parse_sample(_raw(record)) == expected
    assert parse_sample({"__key__": "k1", "json": record}) == expected
    assert sample_to_json(expected) == record
    assert sample_to_json(Sample("k2", (), ("a",))) == {"x": [], "y": ["a"]}


# ---------------------------------------------------------------- write / read


def test_round_trip_in_order_and_deterministic(tmp_path):
    samples = _samples(7)
    paths = write_shards(samples, tmp_path / "a", shard_size=3)
    assert [p.name for p in paths] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [p.name for p in paths]  # no .tmp left
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no shardshuffle / node-splitting warnings
        got = list(iter_samples(paths))
    assert [s for _, s in got] == samples
    assert [u for u, _ in got] == [str(paths[i // 3]) for i in range(7)]
    assert [samples_in(p) for p in paths] == [3, 3, 1]
    again = write_shards(samples, tmp_path / "b", shard_size=3)
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    assert write_shards([], tmp_path / "c", shard_size=3) == []


def test_write_shards_rejects_duplicate_and_bad_keys(tmp_path):
    s = _samples(2)
    with pytest.raises(SampleError, match="k000") as info:
        write_shards([s[0], s[1], s[0]], tmp_path, shard_size=10)
    assert info.value.reason == "duplicate-key"
    with pytest.raises(SampleError) as info:
        write_shards([Sample("a.b", (), ("a",))], tmp_path / "x", shard_size=10)
    assert info.value.reason == "bad-key"


def test_resolve_shards_dir_and_glob(tmp_path):
    write_shards(_samples(4, "t"), tmp_path / "train", shard_size=2)
    write_shards(_samples(2, "v"), tmp_path / "val", shard_size=2)
    root, shards = resolve_shards(tmp_path)
    assert root == tmp_path
    assert [shard_name(root, p) for p in shards] == [
        "train/shard-000000.tar", "train/shard-000001.tar", "val/shard-000000.tar"]
    root, shards = resolve_shards(str(tmp_path / "*" / "shard-*.tar"))
    assert root == tmp_path and len(shards) == 3
    root, shards = resolve_shards(str(tmp_path / "train" / "*.tar"))
    assert root == tmp_path / "train" and [shard_name(root, p) for p in shards][0] == "shard-000000.tar"
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        resolve_shards(str(tmp_path / "nothing-here" / "*.tar"))


def _member_offsets(path):
    with tarfile.open(path) as tar:
        return [(m.offset, m.offset_data, m.size) for m in tar.getmembers()]


@pytest.mark.parametrize("where", ["mid-data", "mid-header", "block-boundary", "empty"])
def test_truncated_shard_raises(tmp_path, where):
    (path,) = write_shards(_samples(4), tmp_path, shard_size=10)
    members = _member_offsets(path)
    _, data2, size2 = members[2]
    cut = {"mid-data": data2 + size2 // 2,  # inside member 2's json
           "mid-header": members[3][0] + 100,  # inside member 3's header block
           "block-boundary": members[3][0],  # right after member 2: tar itself sees a clean end
           "empty": 0}[where]
    path.write_bytes(path.read_bytes()[:cut])
    for on_error in (None, lambda e: None):  # skipping never hides a truncated shard
        with pytest.raises(SampleError) as info:
            list(iter_samples([path], on_error=on_error))
        assert info.value.reason == "truncated-shard" and str(path) in str(info.value)
    with pytest.raises(SampleError, match="truncated|unreadable|end-of-archive"):
        samples_in(path)


def test_tar_without_record_padding_is_complete(tmp_path):
    (path,) = write_shards(_samples(3), tmp_path, shard_size=10)
    last = _member_offsets(path)[-1]
    end = last[1] + -(-last[2] // 512) * 512
    path.write_bytes(path.read_bytes()[: end + 1024])  # members + the two zero blocks, no padding
    assert len(list(iter_samples([path]))) == 3


def _tar_of(members: list[tuple[str, bytes]], path):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _payload(y="a"):
    return json.dumps({"x": ["a"], "y": [y]}).encode()


@pytest.mark.parametrize("names", [
    ["a.json", "b.json", "a.json"],  # key comes back after another key
    ["a.json", "a.json", "b.json"],  # same member twice in a row
])
def test_duplicate_keys(tmp_path, names):
    path = _tar_of([(n, _payload(str(i))) for i, n in enumerate(names)], tmp_path / "d.tar")
    with pytest.raises(SampleError) as info:
        list(iter_samples([path]))
    assert info.value.reason == "duplicate-key" and info.value.key == "a" and str(path) in str(info.value)
    errors = []
    got = list(iter_samples([path], on_error=errors.append))
    assert [e.reason for e in errors] == ["duplicate-key"]
    assert [(s.key, s.y) for _, s in got] == [("a", ("0",)), ("b", (str(names.index("b.json")),))]


def test_bad_samples_raise_or_are_skipped(tmp_path):
    path = _tar_of([("a.json", _payload()), ("b.json", b"{oops"), ("c.json", json.dumps({"x": [], "y": []}).encode()),
                    ("d.json", _payload())], tmp_path / "bad.tar")
    with pytest.raises(SampleError) as info:
        list(iter_samples(path))
    assert (info.value.reason, info.value.key, info.value.shard) == ("bad-json", "b", str(path))
    errors = []
    got = [s.key for _, s in iter_samples(path, on_error=errors.append)]
    assert got == ["a", "d"]
    assert [(e.reason, e.key) for e in errors] == [("bad-json", "b"), ("empty-y", "c")]
