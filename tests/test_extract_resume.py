"""Crash safety: a killed or failing extraction lists nothing torn, and a re-run equals an uninterrupted one."""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

import tokweight.store.writer as writer_module
from tokweight.pipeline.extract import run
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.manifest import read_records
from tokweight.store.parts import sha256_path
from tokweight.store.verify import verify_dir

from tests.fixtures_extract import fp_dir, part_bytes


def _manifest(store):
    return json.loads((fp_dir(store) / "manifest.json").read_text())


def _assert_equal_to_reference(store, reference):
    assert part_bytes(store) == part_bytes(reference)
    ours, ref = _manifest(store), _manifest(reference)
    assert ours["parts"] == ref["parts"] and ours["inputs"] == ref["inputs"] and ours["stats"] == ref["stats"]
    assert verify_dir(fp_dir(store)) == []
    assert not list(fp_dir(store).glob("*.tmp")) and not list(fp_dir(store).glob("part-*.json"))


def _assert_nothing_torn_is_visible(directory):
    """No manifest; every file under a final part name is complete and has its journal record."""
    assert not (directory / "manifest.json").exists()
    records = {r.part.name: r.part for r in read_records(directory)}
    for path in directory.glob("part-*.parquet"):
        pq.read_table(path, page_checksum_verification=True)  # a torn file would not parse
        if path.name in records:
            assert sha256_path(path)[0] == records[path.name].sha256


def test_sigkill_mid_extraction_then_resume(world, tmp_path):
    store = tmp_path / "s"
    directory = store / fp_dir(world.store).name
    cmd = [sys.executable, "-m", "tokweight.cli", "extract", "--checkpoint", str(world.ckpt), "--data",
           str(world.data), "--store", str(store), "--batch-tokens", "1", "--no-progress"]  # one example per forward
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while not (directory.is_dir() and read_records(directory)):  # the first part is committed to the journal
            assert proc.poll() is None and time.monotonic() < deadline, "extract ended before it could be killed"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    _assert_nothing_torn_is_visible(directory)
    assert BaselineStore(store).fingerprints() == []  # readers see nothing yet
    finished_before = len(read_records(directory))
    summary = run(world.config(store, batch_tokens=1))
    assert summary["parts_reused"] == finished_before >= 1 and summary["parts_written"] == 6 - finished_before
    run(world.config(tmp_path / "uninterrupted", batch_tokens=1))  # same batches: byte-identical parts
    _assert_equal_to_reference(store, tmp_path / "uninterrupted")


def test_failure_leaves_a_torn_temporary_that_is_never_listed(world, tmp_path, monkeypatch):
    store, calls = tmp_path / "s", []
    real_write_part = writer_module.write_part

    def crash_on_third_part(table, final, fmt):
        calls.append(final.name)
        if len(calls) == 3:  # half a file under the temporary name, then the process "dies"
            final.with_name(final.name + ".tmp").write_bytes(b"PAR1" + b"\0" * 100)
            raise RuntimeError("simulated crash")
        return real_write_part(table, final, fmt)

    monkeypatch.setattr(writer_module, "write_part", crash_on_third_part)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(world.config(store))
    monkeypatch.undo()
    directory = fp_dir(store)
    assert (directory / "part-00002.parquet.tmp").exists() and not (directory / "part-00002.parquet").exists()
    _assert_nothing_torn_is_visible(directory)
    assert [p.part for p in verify_dir(directory)] == [None]  # "no manifest"
    summary = run(world.config(store))
    assert (summary["parts_reused"], summary["parts_written"]) == (2, 4)
    _assert_equal_to_reference(store, world.store)
