"""Crash safety: a killed or failing extraction lists nothing torn, and a re-run equals an uninterrupted one.

The kills are deterministic: the child process arms the store's fault hook (store.faults)
and kills itself with SIGKILL at a chosen durable write, so no timer or poll can race it.
"""

import os
import shutil
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import tokweight.store.writer as writer_module
from tokweight.pipeline.extract.extract import run
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.manifest import read_records
from tokweight.store.parts import sha256_path
from tokweight.store.verify import verify_dir

from tests.support.fixtures_extract import fp_dir, store_files, writes_of_extraction

WRITES = writes_of_extraction(parts=6)

CHILD = """
import sys
from tokweight.cli import main
from tokweight.store.faults import WriteFault, armed
with armed(WriteFault(at=int(sys.argv[1]), action="SIGKILL")):
    main(sys.argv[2:], prog_name="tokweight")
"""


@pytest.fixture(scope="module")
def reference(world, tmp_path_factory):
    """(store path, every file of an uninterrupted extraction into it); each test here extracts into the
    same path with the same options, so that even the manifest, which records them, must be byte-identical."""
    store = tmp_path_factory.mktemp("resume") / "s"
    run(world.config(store, reader_process=None))
    files = store_files(store)
    shutil.rmtree(store)
    return store, files


def _assert_nothing_torn_is_visible(directory):
    """No manifest; every file under a final part name is complete and has its journal record."""
    assert not (directory / "manifest.json").exists()
    assert BaselineStore(directory.parent).fingerprints() == []  # readers see nothing
    records = {r.part.name: r.part for r in read_records(directory)}
    for path in directory.glob("part-*.parquet"):
        pq.read_table(path, page_checksum_verification=True)  # a torn file would not parse
        if path.name in records:
            assert sha256_path(path)[0] == records[path.name].sha256


def _extract_killed_at(world, store, write: int) -> None:
    """`tokweight extract` in a child process that kills itself at the ``write``-th durable write."""
    cmd = [sys.executable, "-c", CHILD, str(write), "extract", "--checkpoint", str(world.ckpt), "--data",
           str(world.data), "--store", str(store), "--no-progress"]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


@pytest.mark.parametrize("point, reused", [("record-00002", 2), ("manifest", 6)])
def test_sigkill_between_a_part_rename_and_the_manifest_then_resume(world, reference, point, reused):
    """Killed right after part-00002 was renamed into place (before its journal record), or after every
    part and record, before the manifest: the re-run reuses what has a record and ends byte-identical."""
    store, files = reference
    shutil.rmtree(store, ignore_errors=True)
    _extract_killed_at(world, store, WRITES[point])
    directory = fp_dir(store)
    _assert_nothing_torn_is_visible(directory)
    assert (directory / "part-00002.parquet").is_file() and len(read_records(directory)) == reused
    summary = run(world.config(store, reader_process=None))
    assert (summary["parts_reused"], summary["parts_written"]) == (reused, 6 - reused)
    assert store_files(store) == files and verify_dir(directory) == []


def test_failure_leaves_a_torn_temporary_that_is_never_listed(world, reference, monkeypatch):
    store, files = reference
    shutil.rmtree(store, ignore_errors=True)
    calls, real_write_part = [], writer_module.write_part

    def crash_on_third_part(table, final, fmt):
        calls.append(final.name)
        if len(calls) == 3:  # half a file under the temporary name, then the process "dies"
            final.with_name(final.name + ".tmp").write_bytes(b"PAR1" + b"\0" * 100)
            raise RuntimeError("simulated crash")
        return real_write_part(table, final, fmt)

    monkeypatch.setattr(writer_module, "write_part", crash_on_third_part)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(world.config(store, reader_process=None))
    monkeypatch.undo()
    directory = fp_dir(store)
    assert (directory / "part-00002.parquet.tmp").exists() and not (directory / "part-00002.parquet").exists()
    _assert_nothing_torn_is_visible(directory)
    assert [p.part for p in verify_dir(directory)] == [None]  # "no manifest"
    summary = run(world.config(store, reader_process=None))
    assert (summary["parts_reused"], summary["parts_written"]) == (2, 4)
    assert store_files(store) == files
