"""Faults injected at a chosen durable write (store.faults): a full disk (ENOSPC) or an I/O error (EIO)
while a part, a journal record or the manifest is written. The extraction fails with one line naming
the file, nothing half-written is visible, and the next run ends with the same bytes as an
uninterrupted one."""

import shutil

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.extract.extract import run
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.faults import WriteFault, armed
from tokweight.store.manifest import read_records
from tokweight.store.verify import verify_dir
from tokweight.store.writer import StoreWriteError

from tests.support.fixtures_extract import fp_dir, store_files, writes_of_extraction

WRITES = writes_of_extraction(parts=6)


@pytest.fixture(scope="module")
def reference(world, tmp_path_factory):
    """(store path, every file of an uninterrupted extraction into it): each test extracts into this path."""
    store = tmp_path_factory.mktemp("faults") / "s"
    run(world.config(store))
    files = store_files(store)
    shutil.rmtree(store)
    return store, files


def _fail_at(world, store, point: str, action: str, **overrides) -> tuple[WriteFault, StoreWriteError]:
    fault = WriteFault(at=WRITES[point], action=action)
    with armed(fault), pytest.raises(StoreWriteError) as failed:
        run(world.config(store, **overrides))
    return fault, failed.value


@pytest.mark.parametrize("point, action, torn, records", [
    ("part-00002", "ENOSPC", "part-00002.parquet.tmp", 2),
    ("record-00002", "EIO", "part-00002.json.tmp", 2),
    ("manifest", "ENOSPC", "manifest.json.tmp", 6),
    ("manifest", "EIO", "manifest.json.tmp", 6),
])
def test_a_failed_write_commits_nothing_and_the_rerun_is_byte_identical(world, reference, point, action, torn,
                                                                         records):
    store, files = reference
    shutil.rmtree(store, ignore_errors=True)
    fault, error = _fail_at(world, store, point, action)
    directory = fp_dir(store)
    assert fault.paths[-1].name == torn and (directory / torn).is_file()  # torn, under its temporary name only
    message = str(error)
    assert "\n" not in message and torn.removesuffix(".tmp") in message and f"({action})" in message
    assert "re-run the same `tokweight extract`" in message
    assert not (directory / "manifest.json").exists() and BaselineStore(store).fingerprints() == []
    assert len(read_records(directory)) == records
    assert run(world.config(store))["parts_reused"] == records
    assert store_files(store) == files and verify_dir(directory) == []


def test_a_failed_recommit_keeps_the_old_manifest(world, reference):
    """Repairing a store whose part was lost: the manifest's rewrite fails, the committed one stays as it was."""
    store, files = reference
    shutil.rmtree(store, ignore_errors=True)
    run(world.config(store))
    directory = fp_dir(store)
    (directory / "part-00003.parquet").unlink()
    fault, _ = _fail_at(world, store, "part-00001", "ENOSPC")  # write 3: part-00003, its record, the manifest
    assert fault.paths[-1].name == "manifest.json.tmp"
    assert (directory / "manifest.json").read_bytes() == files[f"{directory.name}/manifest.json"]
    assert verify_dir(directory) == []  # the part was re-written and its record with it: nothing is missing
    assert run(world.config(store))["nothing_to_do"] and store_files(store) == files


def test_a_failed_zarr_part_leaves_a_torn_temporary_directory(world, tmp_path):
    store = tmp_path / "z"
    run(world.config(store, format="zarr"))
    files = store_files(store)
    shutil.rmtree(store)
    fault, error = _fail_at(world, store, "part-00000", "EIO", format="zarr")  # its first file
    directory = fp_dir(store)
    assert fault.paths[-1].is_relative_to(directory / "part-00000.zarr.tmp") and "part-00000.zarr" in str(error)
    assert [p.name for p in directory.iterdir() if p.name.startswith("part-")] == ["part-00000.zarr.tmp"]
    run(world.config(store, format="zarr"))
    assert store_files(store) == files and verify_dir(directory) == []


def test_the_cli_says_it_in_one_line(world, reference):
    store, _ = reference
    shutil.rmtree(store, ignore_errors=True)
    with armed(WriteFault(at=WRITES["manifest"], action="ENOSPC")):
        result = CliRunner().invoke(main, ["extract", "--checkpoint", str(world.ckpt), "--data", str(world.data),
                                           "--store", str(store), "--no-progress", "--no-reader-process"])
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert "manifest.json" in line and "No space left on device (ENOSPC)" in line
