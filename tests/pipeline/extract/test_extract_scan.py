"""The tar scan's direct header reading (``shards._plain_members``) gives tarfile's members, or leaves
the tar to tarfile: the same members, and the same truncated-shard errors, wherever a tar is cut."""

import gzip
import io
import tarfile

import pytest

from tokweight.pipeline.data import shards
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_shard, scan_shard, write_shards

from tests.support.fixtures_extract import sample_member, write_raw_tar


def described(members: list[tarfile.TarInfo]) -> list[tuple]:
    return [(m.name, m.type, m.offset, m.offset_data, m.size) for m in members]


def tarfile_scan(path, monkeypatch) -> list[tuple] | str:
    """scan_shard through tarfile alone: its members, or the reason it raised."""
    with monkeypatch.context() as patch:
        patch.setattr(shards, "_plain_members", lambda path: None)
        return scanned(path)


def scanned(path) -> list[tuple] | str:
    try:
        return described(scan_shard(path))
    except SampleError as error:
        return error.reason


@pytest.fixture
def shard(tmp_path):
    samples = [Sample(key=f"k{i}", x=("a", "b"), y=("c",) * i) for i in range(1, 6)]
    [path] = write_shards(samples, tmp_path / "data", shard_size=10)
    return path


def test_a_webdataset_shard_is_read_directly_with_tarfiles_members(shard, monkeypatch):
    direct = shards._plain_members(shard)
    assert direct is not None and described(direct) == tarfile_scan(shard, monkeypatch)
    with tarfile.open(shard) as tar:  # the members read their data as tarfile's do
        assert [tar.extractfile(m).read() for m in direct] == [tar.extractfile(m).read() for m in tar]


def test_cut_anywhere_the_scan_says_what_tarfile_says(shard, tmp_path, monkeypatch):
    data = shard.read_bytes()
    cut = tmp_path / "cut.tar"
    for length in sorted({0, 1, 511, 512, 513, 1024, 1536, len(data) // 2, len(data) - 1024, len(data) - 512,
                          len(data) - 1, *range(2048, len(data), 1531)}):
        cut.write_bytes(data[:length])
        assert scanned(cut) == tarfile_scan(cut, monkeypatch), length


def test_headers_it_does_not_read_are_left_to_tarfile(tmp_path, monkeypatch):
    long_name = write_raw_tar(tmp_path / "long.tar", [sample_member("p" * 120 + "/k", {"x": [], "y": []})])  # a ustar prefix
    pax = tmp_path / "pax.tar"
    with tarfile.open(pax, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("é" * 120 + ".json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    compressed = tmp_path / "shard.tar.gz"
    compressed.write_bytes(gzip.compress(long_name.read_bytes()))
    for path in (long_name, pax, compressed):
        assert shards._plain_members(path) is None
        assert scanned(path) == tarfile_scan(path, monkeypatch) and len(scanned(path)) == 1


def test_a_compressed_shard_reads_the_same_samples(shard, tmp_path):
    """Members are read from the archive's decompressed stream, not from the file's bytes."""
    compressed = tmp_path / "shard.tar.gz"
    compressed.write_bytes(gzip.compress(shard.read_bytes()))
    assert [s for _, s in iter_shard(compressed)] == [s for _, s in iter_shard(shard)]
