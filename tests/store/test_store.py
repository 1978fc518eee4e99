"""The store: both part formats, the reader API, verify and repair, fingerprint isolation, the lock, the CLI."""

import json
import math
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.extract.extract import run
from tokweight.pipeline.data.shards import resolve_shards
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.derived import DERIVED_SCALARS
from tokweight.store.sql_config import STORED_EPS, STORED_Q, STORED_TAU
from tokweight.store.durable import canonical_bytes
from tokweight.store.lock import StoreLock, StoreLockedError
from tokweight.store.manifest import CHECKSUM_KEY, write_checked_json
from tokweight.store.parts import read_part, sha256_path
from tokweight.store.schema import SCHEMA_VERSION, added_after
from tokweight.store.sql import connect
from tokweight.store.verify import verify_dir

from tests.support.fixtures_extract import copy_store, fp_dir, part_bytes


def test_manifest_matches_contract_and_parts(world):
    view = BaselineStore(world.store).open()
    m = view.manifest
    assert m["complete"] and m["format"] == "parquet" and m["dtype"] == "float32" and m["units"] == "nats"
    assert m["fingerprint"] == view.fingerprint and len(view.fingerprint) == 32
    assert m["checkpoint"]["fingerprint"] == view.fingerprint
    assert [p["name"] for p in view.parts()] == [f"part-{i:05d}.parquet" for i in range(6)]
    records = [f"part-{i:05d}.json" for i in range(6)]  # the journal, kept after the commit
    listed = [".lock", "manifest.json", *[p["name"] for p in view.parts()], *records]
    assert sorted(p.name for p in view.dir.iterdir()) == sorted(listed)
    total_rows = total_tokens = 0
    for entry in view.parts():
        table = view.read_part(entry["name"])
        assert len(table) == entry["rows"] == 128 and table.column("T").to_numpy().sum() == entry["tokens"]
        b_sum, b_sq_sum, b_xlogx_sum, b_max, t0_share, t0_threshold = (table.column(c).to_pylist()
                                                                         for c in DERIVED_SCALARS)
        for i, (b, cs) in enumerate(zip(table.column("b").to_pylist(), table.column("cumsum_b").to_pylist())):
            b = np.array(b, dtype=np.float64)
            assert cs[-1] == pytest.approx(b_sum[i], abs=1e-4) and b.sum() == pytest.approx(b_sum[i], rel=1e-12)
            assert b_sq_sum[i] == pytest.approx(np.sum(b * b), rel=1e-12) and b_max[i] == b.max()
            assert b_xlogx_sum[i] == pytest.approx(np.sum(b[b > 0] * np.log(b[b > 0])), rel=1e-12, abs=1e-15)
            reached = np.nonzero(np.array(cs, np.float32).astype(np.float64) >= STORED_Q * b_sum[i])[0]
            assert t0_share[i] == (None if b_sum[i] < STORED_EPS else int(reached[0]) if reached.size else len(b) - 1)
            above = np.nonzero(b > STORED_TAU)[0]
            assert t0_threshold[i] == (int(above[-1]) if above.size else None)
        total_rows, total_tokens = total_rows + len(table), total_tokens + entry["tokens"]
    assert m["stats"]["rows"] == total_rows and m["stats"]["tokens"] == total_tokens
    inputs = {e["name"]: e for e in m["inputs"]}
    assert all(e["samples"] == 128 for e in inputs.values()) and len(inputs) == 6
    assert view.vocab_tokens() == json.loads((world.ckpt / "vocab.json").read_text())["tokens"]


def test_parquet_encodings(world):
    view = BaselineStore(world.store).open()
    meta = pq.ParquetFile(view.part_path(view.parts()[0]["name"])).metadata
    assert meta.num_row_groups == 1
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert all(c.compression == "ZSTD" for c in columns.values())
    for name in ("b", "entropy", "cumsum_b"):
        assert "BYTE_STREAM_SPLIT" in columns[f"{name}.list.element"].encodings
    for name, column in columns.items():
        assert ("RLE_DICTIONARY" in column.encodings) == (name in ("key", "shard", "strategy"))


def test_zarr_format_round_trips_and_is_checksummed(world, tmp_path):
    summary = run(world.config(tmp_path / "z", format="zarr"))
    zview, pview = BaselineStore(tmp_path / "z").open(), BaselineStore(world.store).open()
    assert summary["fingerprint"] == pview.fingerprint and zview.manifest["format"] == "zarr"
    for zpart, ppart in zip(zview.parts(), pview.parts()):
        assert zview.read_part(zpart["name"]).equals(pview.read_part(ppart["name"]))
    meta = json.loads((zview.dir / "part-00000.zarr" / "b" / "zarr.json").read_text())
    assert meta["fill_value"] == "NaN"
    assert {"name": "zstd", "configuration": {"level": 3, "checksum": True}} in meta["codecs"]
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == meta["shape"]  # one chunk per part
    assert verify_dir(zview.dir) == []
    chunk = zview.dir / "part-00001.zarr" / "b" / "c" / "0"
    chunk.unlink()  # a missing chunk would read back as NaN: verify names the part instead
    assert [p.part for p in verify_dir(zview.dir)] == ["part-00001.zarr"]
    with pytest.raises(ValueError, match="part-00001.zarr"):
        zview.read_part("part-00001.zarr")
    assert run(world.config(tmp_path / "z", format="zarr"))["parts_written"] == 1
    assert verify_dir(zview.dir) == []


def test_rerun_on_complete_store_does_nothing(world, tmp_path):
    store = copy_store(world.store, tmp_path / "s")
    manifest = fp_dir(store) / "manifest.json"
    before = (manifest.read_bytes(), manifest.stat().st_mtime_ns)
    summary = run(world.config(store))
    assert summary["nothing_to_do"] and summary["parts_written"] == 0
    assert (manifest.read_bytes(), manifest.stat().st_mtime_ns) == before
    result = CliRunner().invoke(main, ["extract", "--checkpoint", str(world.ckpt), "--data", str(world.data),
                                       "--store", str(store), "--no-progress"])
    assert result.exit_code == 0 and "nothing to do" in result.output


def test_shards_join_by_content_after_a_move(world, tmp_path):
    moved = shutil.copytree(world.data, tmp_path / "moved")
    view = BaselineStore(world.store).open()
    _, paths = resolve_shards(moved)
    entry = view.input_for_shard(paths[0])
    assert entry["name"] == "test/shard-000000.tar" and entry["part"] == "part-00000.parquet"
    rows = view.rows_for_shard(paths[0])
    assert len(rows) == 128 and all(r["b"].shape == (r["T"],) for r in rows.values())
    changed = tmp_path / "changed.tar"
    data = paths[0].read_bytes()
    changed.write_bytes(data[:600] + bytes([data[600] ^ 1]) + data[601:])  # same size, other bytes
    with pytest.raises(KeyError, match="changed.tar"):
        view.input_for_shard(changed)
    per_part = [p["sum_example_mean_b"] / p["rows"] for p in view.parts()]
    assert view.mean_example_mean_b([paths[0]]) == pytest.approx(per_part[0])
    assert view.mean_example_mean_b() == pytest.approx(np.mean(per_part))


@pytest.mark.parametrize("damage", ["truncate", "flip-byte", "delete"])
def test_verify_names_damaged_part_and_extract_repairs(world, tmp_path, damage):
    store = copy_store(world.store, tmp_path / "s")
    good = part_bytes(world.store)
    part = fp_dir(store) / "part-00003.parquet"
    data = part.read_bytes()
    if damage == "truncate":
        part.write_bytes(data[: len(data) // 2])
    elif damage == "flip-byte":
        part.write_bytes(data[:100] + bytes([data[100] ^ 0x01]) + data[101:])
    else:
        part.unlink()
    problems = verify_dir(fp_dir(store))
    assert [p.part for p in problems] == ["part-00003.parquet"]
    result = CliRunner().invoke(main, ["store", "verify", str(store)])
    assert result.exit_code == 1 and "part-00003.parquet" in result.output
    summary = run(world.config(store))
    assert summary["parts_written"] == 1 and summary["parts_reused"] == 5
    assert verify_dir(fp_dir(store)) == [] and part_bytes(store) == good  # deterministic writes: same bytes
    assert CliRunner().invoke(main, ["store", "verify", str(store)]).exit_code == 0


@pytest.mark.parametrize("lost_record", [False, True])
def test_extract_rebuilds_a_manifest_that_does_not_verify(world, tmp_path, lost_record):
    """A flipped bit in the manifest: readers refuse it, the same extract rebuilds it from the journal records
    and their verified parts (re-extracting a part whose record is gone), byte for byte."""
    store = tmp_path / "s"
    run(world.config(store))  # extracted here, not copied: the manifest records the store's path
    directory = fp_dir(store)
    good = (directory / "manifest.json").read_bytes()
    at = good.index(b'"data_root"') + 20
    (directory / "manifest.json").write_bytes(good[:at] + bytes([good[at] ^ 0x04]) + good[at + 1:])
    if lost_record:
        (directory / "part-00004.json").unlink()
    with pytest.raises(ValueError, match="manifest.json: its content_sha256 .* re-run the `tokweight extract`"):
        BaselineStore(store).open()
    assert [p.part for p in verify_dir(directory)] == ["manifest.json"]
    summary = run(world.config(store))
    assert (summary["parts_reused"], summary["parts_written"]) == ((5, 1) if lost_record else (6, 0))
    assert (directory / "manifest.json").read_bytes() == good and verify_dir(directory) == []
    assert part_bytes(store) == part_bytes(world.store)


def test_verify_reports_stray_part_and_bad_counts(world, tmp_path):
    store = copy_store(world.store, tmp_path / "s")
    directory = fp_dir(store)
    shutil.copy(directory / "part-00000.parquet", directory / "part-00009.parquet")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["parts"][1]["rows"] += 1
    write_checked_json(directory / "manifest.json", manifest)  # a manifest that verifies, but is wrong
    found = {str(p) for p in verify_dir(directory)}
    assert "part-00001.json: disagrees with the manifest's entry of part-00001.parquet" in found
    assert any(s.startswith("part-00009.parquet: not listed") for s in found)
    assert any(s.startswith("part-00001.parquet: 128 rows, manifest says 129") for s in found)


def test_fingerprint_isolation(world, tmp_path):
    store = copy_store(world.store, tmp_path / "s")
    summary = run(world.config(store, checkpoint=str(world.ckpt_other)))
    base_fp = BaselineStore(world.store).fingerprints()[0]
    assert summary["fingerprint"] != base_fp and summary["parts_written"] == 6
    stores = BaselineStore(store)
    assert stores.fingerprints() == sorted([base_fp, summary["fingerprint"]])
    with pytest.raises(ValueError, match="2 fingerprints"):
        stores.open()
    a, b = stores.open(base_fp), stores.open(summary["fingerprint"])
    assert part_bytes(world.store) == {p["name"]: (a.dir / p["name"]).read_bytes() for p in a.parts()}
    assert a.mean_example_mean_b() != b.mean_example_mean_b()  # a 1e-3 bias change moves every b
    result = CliRunner().invoke(main, ["store", "ls", str(store), "--json"])
    assert [json.loads(line)["state"] for line in result.output.splitlines()] == ["complete", "complete"]


def test_other_format_in_same_fingerprint_is_refused(world, tmp_path):
    store = copy_store(world.store, tmp_path / "s")
    with pytest.raises(ValueError, match="--format parquet"):
        run(world.config(store, format="zarr"))


def _as_older_version(store, version: int) -> dict:
    """Rewrite a current store as one of an older schema version wrote it: the parts without the columns
    added since, the manifest without a checksum and journal records (both came with version 3)."""
    directory = fp_dir(store)
    manifest = json.loads((directory / "manifest.json").read_text())
    for entry in manifest["parts"]:
        part = directory / entry["name"]
        pq.write_table(pq.read_table(part).drop_columns(list(added_after(version))), part)
        entry["sha256"], entry["bytes"] = sha256_path(part)
        (directory / entry["name"]).with_suffix(".json").unlink()
    del manifest[CHECKSUM_KEY]
    (directory / "manifest.json").write_bytes(canonical_bytes({**manifest, "schema_version": version}))
    return manifest


@pytest.mark.parametrize("version", [1, 2])
def test_a_store_of_an_older_schema_version_reads_like_a_current_one(world, tmp_path, capsys, version):
    """Readers compute the columns it lacks (said once on stderr by SQL); extract refuses to add to it."""
    store = copy_store(world.store, tmp_path / "s")
    _as_older_version(store, version)
    old, new = BaselineStore(store).open(), BaselineStore(world.store).open()
    assert old.schema_version == version and verify_dir(old.dir) == []
    for entry in new.parts():
        assert old.read_part(entry["name"]).equals(new.read_part(entry["name"]))
    query = "SELECT * FROM examples ORDER BY key"
    assert connect(store).sql(query).fetchall() == connect(world.store).sql(query).fetchall()
    err = capsys.readouterr().err
    assert f"has store schema version {version}: its " in err and "t0_share, t0_threshold are computed" in err
    connect(store)
    assert capsys.readouterr().err == ""  # said once per process, by the first connection
    with pytest.raises(ValueError, match=f"schema version {version}.*writes version {SCHEMA_VERSION}"):
        run(world.config(store))


def test_unreadable_schema_version_and_foreign_columns_are_refused(world, tmp_path):
    """Readers name the file and the versions instead of reading other columns."""
    store = copy_store(world.store, tmp_path / "s")
    manifest_path = fp_dir(store) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    write_checked_json(manifest_path, {**manifest, "schema_version": SCHEMA_VERSION + 1})
    for action in (lambda: BaselineStore(store).open(), lambda: run(world.config(store))):  # never rebuilt over
        with pytest.raises(ValueError, match=f"manifest.json: store schema version {SCHEMA_VERSION + 1}, but"):
            action()
    part = fp_dir(store) / manifest["parts"][0]["name"]
    pq.write_table(pq.read_table(part).drop_columns(["b_sq_sum"]), part)
    with pytest.raises(ValueError, match=f"{part.name}: its columns are not those of store schema version"):
        read_part(part, "parquet")


def test_lock_excludes_a_second_writer(world, tmp_path):
    store = copy_store(world.store, tmp_path / "s")
    (fp_dir(store) / "part-00002.parquet").unlink()
    with StoreLock(fp_dir(store)):
        with pytest.raises(StoreLockedError, match="pid"):
            run(world.config(store))
        with pytest.raises(StoreLockedError):
            run(world.config(store, lock_wait_s=0.3))
        with pytest.raises(StoreLockedError):
            StoreLock(fp_dir(store)).acquire()
    assert run(world.config(store))["parts_written"] == 1  # released on exit


def test_a_waiting_lock_is_told_once_then_takes_the_lock_when_the_holder_lets_go(tmp_path):
    holder = StoreLock(tmp_path)
    holder.acquire()
    told = []

    def holder_finishes(message: str) -> None:  # the deterministic hook: no timing
        told.append(message)
        holder.release()

    with StoreLock(tmp_path, wait_s=math.inf, poll_s=0, waiting=holder_finishes):
        with pytest.raises(StoreLockedError, match="no tokweight process is writing it"):
            StoreLock(tmp_path).acquire()
    assert len(told) == 1 and "waiting" in told[0] and "pid" in told[0]
