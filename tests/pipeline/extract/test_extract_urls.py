"""Extraction from URLs (a local HTTP server in a thread, and pipe: commands): each shard streamed once, the same
store bytes as from disk, faults named with their URL and nothing half-committed, resumes that read only what the
store has not committed, and keys unique across shards."""

import hashlib
import shutil
from dataclasses import replace

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.extract import extract as extract_module
from tokweight.pipeline.extract.extract import run
from tokweight.pipeline.data.urls import FetchError, ShardChangedError
from tokweight.pipeline.extract.config import Retry
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.manifest import read_records
from tokweight.store.verify import verify_dir

from tests.support.fixtures_extract import fp_dir, part_bytes, sample_member, write_raw_tar
from tests.support.http_shards import ShardServer

NOW = Retry(attempts=3, backoff_s=0)  # no test waits on a clock
SHARDS = ["test/shard-000000.tar", *(f"train/shard-00000{i}.tar" for i in range(4)), "val/shard-000000.tar"]
PATTERN = "{train/shard-{000000..000003},val/shard-000000,test/shard-000000}.tar"


@pytest.fixture
def server(world):
    with ShardServer(world.data) as served:
        yield served


def extract(world, store, data, **overrides):
    return run(world.config(store, data=data, retry=NOW, **overrides))


def inputs(store) -> list[dict]:
    return BaselineStore(store).open().manifest["inputs"]


def test_a_store_from_http_has_the_bytes_of_the_store_from_disk(world, server, tmp_path):
    summary = extract(world, tmp_path / "s", server.url(PATTERN), reader_process=True)
    assert summary["reader_process"] and summary["parts_written"] == 6
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)
    local = {e["name"]: e for e in inputs(world.store)}
    for entry in inputs(tmp_path / "s"):  # name, size, sha256 (of the bytes streamed), samples, part
        assert entry.pop("url") == server.url(entry["name"])
        assert entry == local[entry["name"]]
    assert dict(server.requests) == {name: 1 for name in SHARDS}  # each shard streamed once, nothing else read
    assert verify_dir(fp_dir(tmp_path / "s")) == []


def test_pipe_commands_and_a_url_list_file(world, tmp_path):
    listing = tmp_path / "urls.txt"
    listing.write_text("# one URL per line\n" + "".join(f"pipe:cat {world.data}/{name}\n" for name in SHARDS))
    extract(world, tmp_path / "s", str(listing))
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)
    assert {e["url"] for e in inputs(tmp_path / "s")} == {f"pipe:cat {world.data}/{n}" for n in SHARDS}


def test_a_404_is_one_line_naming_the_url_and_commits_nothing(world, server, tmp_path):
    server.fault("train/shard-000002.tar", "404")
    args = ["extract", "--checkpoint", str(world.ckpt), "--data", server.url(PATTERN), "--store", str(tmp_path / "s"),
            "--no-progress", "--no-reader-process"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert server.url("train/shard-000002.tar") in line and "404" in line and "not retried" in line
    assert server.requests["train/shard-000002.tar"] == 1
    assert BaselineStore(tmp_path / "s").fingerprints() == []
    extract(world, tmp_path / "s", server.url(PATTERN))  # the next run completes
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)


def test_a_connection_dropped_mid_shard_is_retried_from_the_start(world, server, tmp_path):
    server.fault("train/shard-000001.tar", "drop", times=1, at=5000)
    server.fault("train/shard-000003.tar", "503", times=2)
    extract(world, tmp_path / "s", server.url(PATTERN))
    assert server.requests["train/shard-000001.tar"] == 2 and server.requests["train/shard-000003.tar"] == 3
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)


def test_a_connection_that_keeps_dropping_fails_naming_the_url_and_the_rerun_completes(world, server, tmp_path):
    server.fault("train/shard-000001.tar", "drop", times=NOW.attempts, at=5000)
    with pytest.raises(FetchError) as failed:
        extract(world, tmp_path / "s", server.url(PATTERN))
    message = str(failed.value)
    assert "\n" not in message and server.url("train/shard-000001.tar") in message
    assert f"gave up after {NOW.attempts} attempts" in message and "(18)" in message
    directory = fp_dir(tmp_path / "s")
    assert BaselineStore(tmp_path / "s").fingerprints() == []  # nothing committed
    assert [r.input.name for r in read_records(directory)] == ["test/shard-000000.tar", "train/shard-000000.tar"]
    server.requests.clear()
    summary = extract(world, tmp_path / "s", server.url(PATTERN))
    assert summary["parts_reused"] == 2 and summary["parts_written"] == 4
    assert dict(server.requests) == {name: 1 for name in SHARDS}  # the journaled two checked once, by their bytes
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)


def test_a_pipe_command_that_fails_is_one_line_naming_it(world, tmp_path):
    data = f"pipe:cat {world.data}/{{train/shard-000000,train/nothing-here}}.tar"
    with pytest.raises(FetchError) as failed:
        extract(world, tmp_path / "s", data)
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"pipe:cat {world.data}/train/nothing-here.tar: ")
    assert f"exited with status 1 (gave up after {NOW.attempts} attempts)" in message
    assert BaselineStore(tmp_path / "s").fingerprints() == []


def test_a_resumed_extraction_reads_only_what_is_not_committed(world, server, tmp_path):
    train = server.url("train/shard-{000000..000003}.tar")
    extract(world, tmp_path / "s", train)
    assert extract(world, tmp_path / "s", train)["nothing_to_do"]
    server.requests.clear()
    summary = extract(world, tmp_path / "s", server.url("{train/shard-{000000..000003},val/shard-000000}.tar"))
    assert summary["parts_reused"] == 4 and summary["parts_written"] == 1
    assert dict(server.requests) == {"val/shard-000000.tar": 1}  # the committed four are not read again


def test_a_journaled_shard_whose_bytes_changed_is_named_and_extracted_again(world, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(world.data, data)
    with ShardServer(data) as server:
        server.fault("train/shard-000002.tar", "404", times=1)
        with pytest.raises(FetchError):
            extract(world, tmp_path / "s", server.url(PATTERN))  # test/ and train/0, 1 journaled
        changed = data / "train" / "shard-000001.tar"
        changed.write_bytes((data / "val" / "shard-000000.tar").read_bytes())  # same URL, other bytes
        (data / "val" / "shard-000000.tar").unlink()
        summary = extract(world, tmp_path / "s", server.url("{test/shard-000000,train/shard-{000000..000003}}.tar"))
    assert summary["changed_shards"] == [f"train/shard-000001.tar ({server.url('train/shard-000001.tar')})"]
    view = BaselineStore(tmp_path / "s").open()
    entry = next(e for e in view.manifest["inputs"] if e["name"] == "train/shard-000001.tar")
    reference = next(e for e in inputs(world.store) if e["name"] == "val/shard-000000.tar")
    assert (entry["size"], entry["sha256"]) == (reference["size"], reference["sha256"])
    assert verify_dir(fp_dir(tmp_path / "s")) == []


def _twins(root):
    good = {"x": ["a", "b"], "y": ["c", "d", "e"]}
    write_raw_tar(root / "train" / "shard-000000.tar", [sample_member(k, good) for k in ("a0", "twin", "a1")])
    write_raw_tar(root / "train" / "shard-000001.tar", [sample_member(k, good) for k in ("b0", "twin", "b1")])
    return root


@pytest.mark.parametrize("apart", [False, True])
def test_a_key_in_two_url_shards_is_refused_naming_both_urls(world, tmp_path, monkeypatch, apart):
    if apart:
        ranks_apart(monkeypatch)
    with ShardServer(_twins(tmp_path / "data")) as server:
        with pytest.raises(SampleError) as info:
            extract(world, tmp_path / "s", server.url("train/shard-{000000..000001}.tar"))
        first, later = server.url("train/shard-000000.tar"), server.url("train/shard-000001.tar")
    assert info.value.reason == "duplicate-key"
    assert f"key 'twin' occurs in shards shard-000000.tar ({first}) and shard-000001.tar ({later})" in str(info.value)
    assert BaselineStore(tmp_path / "s").fingerprints() == []


def ranks_apart(monkeypatch):
    """Each shard read as if by a rank of its own: no rank sees another's keys, so only the check before
    the commit can find a key in two shards."""
    monkeypatch.setattr(extract_module, "unique_across_shards", lambda prepared, prepare, policy: prepared)


@pytest.mark.parametrize("apart", [False, True])
def test_a_key_in_two_url_shards_is_skipped_in_the_later_one_as_from_disk(world, tmp_path, monkeypatch, apart):
    """Found as the shards arrive, or (apart) before the commit, where the later shard is extracted again;
    either way the store of the same tars on disk."""
    data = _twins(tmp_path / "data")
    run(world.config(tmp_path / "disk", data=str(data / "train"), on_bad_sample="skip"))
    if apart:
        ranks_apart(monkeypatch)
    with ShardServer(data) as server:
        summary = extract(world, tmp_path / "s", server.url("train/shard-{000000..000001}.tar"), on_bad_sample="skip")
    assert summary["skipped_shards"] == {"shard-000001.tar": {"duplicate-key": 1}}
    assert server.requests["train/shard-000001.tar"] == 2  # read again, without its twin
    assert part_bytes(tmp_path / "s") == part_bytes(tmp_path / "disk")
    later = BaselineStore(tmp_path / "s").open().parts()[1]
    assert later["skipped_keys"] == {"duplicate-key": ["twin"]}


def test_the_same_bytes_at_two_urls_are_refused(world, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(world.data / "val", data / "a")
    shutil.copytree(world.data / "val", data / "b")
    with ShardServer(data) as server, pytest.raises(ValueError, match="identical content"):
        extract(world, tmp_path / "s", server.url("{a,b}/shard-000000.tar"), on_bad_sample="skip")
    assert BaselineStore(tmp_path / "s").fingerprints() == []


def test_a_url_that_changed_while_extracting_is_never_mixed_in(world, tmp_path):
    from tokweight.pipeline.extract.prepare import read_input
    from tokweight.pipeline.extract.plan import Task
    from tokweight.store.writer import InputShard

    url = f"pipe:cat {world.data}/val/shard-000000.tar"
    task = Task(InputShard(None, "val/shard-000000.tar", 10, "0" * 64, url), "part-00000.parquet", 0)
    with pytest.raises(ShardChangedError, match="val/shard-000000.tar changed since its part was written"):
        read_input(task, NOW)
    read, data = read_input(replace(task, shard=replace(task.shard, size=None, sha256=None)), NOW)
    local = (world.data / "val" / "shard-000000.tar").read_bytes()
    assert data == local and (read.shard.size, read.shard.sha256) == (len(local), hashlib.sha256(local).hexdigest())
