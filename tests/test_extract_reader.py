"""The reader process (a spawned DataLoader worker) gives the same store as reading in-process,
its errors reach the caller as the same exceptions, naming shard and key, and the default mode
takes it only with CPUs to spare (``reader_pays``)."""

import pytest
import torch

from tokweight import extract_cli
from tokweight.pipeline import extract
from tokweight.pipeline.errors import SampleError
from tokweight.pipeline.extract import run
from tokweight.pipeline.extract_reader import ReaderFailure
from tokweight.store.baseline_store import BaselineStore

from tests.fixtures_extract import fp_dir, part_bytes, sample_member, write_raw_tar

GOOD = {"x": ["a", "b"], "y": ["c", "d", "e"], "strategy": "copy", "t0": 1}


def test_reader_process_store_is_byte_identical(world, tmp_path, monkeypatch):
    """The default mode with CPUs to spare takes the reader process: shard 0 is prepared in-process and
    shards 1-5 by the worker, and every part equals the in-process store's."""
    monkeypatch.setattr(extract, "cpus_per_process", lambda: 64)
    summary = run(world.config(tmp_path / "s", reader_process=None))
    assert summary["parts_written"] == 6 and summary["reader_process"] is True
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)


def test_the_default_reads_in_process_without_cpus_to_spare(world, tmp_path, monkeypatch):
    monkeypatch.setattr(extract, "cpus_per_process", lambda: torch.get_num_threads())  # every CPU in the forward
    summary = run(world.config(tmp_path / "s", reader_process=None))
    assert summary["reader_process"] is False
    assert part_bytes(tmp_path / "s") == part_bytes(world.store)
    [option] = [p for p in extract_cli.extract.params if p.name == "reader_process"]
    assert option.default is None  # the CLI's default is this rule too


@pytest.mark.parametrize("device, cpus, threads, pays", [
    ("cpu", 2, 1, True),  # the 2-core VM with one torch thread: the other CPU reads
    ("cpu", 2, 2, False),  # torch's default there: both CPUs in the forward
    ("cpu", 1, 1, False),
    ("cpu", 16, 16, False),
    ("cpu", 16, 15, True),
    ("cpu", 16, 8, True),
    ("cuda", 2, 2, True),  # the forward runs on the device: one CPU beside the main thread is enough
    ("cuda", 1, 1, False),
])
def test_reader_pays_with_cpus_to_spare_beside_the_forward(device, cpus, threads, pays):
    assert extract.reader_pays(device, cpus, threads) is pays


def test_one_shard_or_an_explicit_choice_overrides_the_rule(world, tmp_path):
    assert not extract.uses_reader_process(world.config(tmp_path, reader_process=True), 1)
    assert not extract.uses_reader_process(world.config(tmp_path, reader_process=False), 6)
    assert extract.uses_reader_process(world.config(tmp_path, reader_process=True), 2)


def _data(tmp_path, bad_record):
    """a/shard.tar (good, prepared in-process) then b/shard.tar with one bad sample k1 (prepared by the worker)."""
    write_raw_tar(tmp_path / "data" / "a" / "shard.tar", [sample_member(f"g{i}", GOOD) for i in range(3)])
    write_raw_tar(tmp_path / "data" / "b" / "shard.tar",
                  [sample_member("k0", GOOD), sample_member("k1", bad_record), sample_member("k2", GOOD)])
    return tmp_path / "data"


def test_worker_sample_error_names_shard_and_key(world, tmp_path):
    data = _data(tmp_path, {"x": ["a"], "y": ["c", "zz"]})
    with pytest.raises(SampleError) as info:
        run(world.config(tmp_path / "s", data=str(data), reader_process=True))
    assert info.value.reason == "unknown-symbol" and info.value.key == "k1"
    assert "b/shard.tar" in str(info.value)
    assert not (fp_dir(tmp_path / "s") / "manifest.json").exists()
    summary = run(world.config(tmp_path / "s", data=str(data), reader_process=True, on_bad_sample="skip"))
    assert summary["skipped"] == {"unknown-symbol": 1}
    view = BaselineStore(tmp_path / "s").open()
    assert [p["rows"] for p in view.parts()] == [3, 2]


def test_reader_failure_survives_pickling_as_the_same_exception():
    import pickle

    sample = pickle.loads(pickle.dumps(ReaderFailure.of(SampleError("too-long", "long", key="k", shard="s.tar"))))
    error = sample.exception()
    assert isinstance(error, SampleError) and (error.reason, error.key, error.shard) == ("too-long", "k", "s.tar")
    other = pickle.loads(pickle.dumps(ReaderFailure.of(RuntimeError("refusing to write")))).exception()
    assert isinstance(other, RuntimeError) and str(other) == "refusing to write"
    assert "reader process" in other.__notes__[0]


def test_gc_frozen_freezes_for_the_block_only_and_leaves_a_callers_freeze_alone():
    import gc

    from tokweight.pipeline.extract_reader import gc_frozen

    assert gc.get_freeze_count() == 0
    with gc_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_frozen():
            pass
        assert gc.get_freeze_count() == frozen  # the caller's, untouched
    finally:
        gc.unfreeze()
