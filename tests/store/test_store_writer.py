"""store.writer and the manifest entries: the JSON is the contract's, key for key; nothing is visible before commit."""

import json
import math

import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.store.baseline_store import BaselineStore
from tokweight.store.durable import write_json_atomic
from tokweight.store.formats import PART_FORMATS
from tokweight.store.manifest import (CHECKSUM_KEY, MANIFEST_NAME, InputEntry, Manifest, PartEntry, Provenance, Record,
                                      checked_bytes, part_index, read_records, tool_version)
from tokweight.store.parts import PART_IO
from tokweight.store.schema import SCHEMA_VERSION
from tokweight.store.writer import StoreWriter, hash_inputs

from tests.support.fixtures_extract import fp_dir
from tests.support.fixtures_sql import example_rows, rows_table

FP = "e" * 32
PROVENANCE = Provenance(template_version="t1", checkpoint_path="/ckpt", model_config={"d_model": 8},
                        vocab=("<pad>", "a"), data_root="/data", extract_config={"format": "parquet"})


def _part(name: str, shard: str, rows: int, skipped: dict) -> dict:
    return {"name": name, "input": shard, "sha256": "1" * 64, "bytes": 100 + rows, "rows": rows, "tokens": 3 * rows,
            "b_sum": rows / 3, "sum_example_mean_b": rows / 7, "skipped": skipped}


def _input(shard: str, samples: int | None, part: str | None) -> dict:
    return {"name": shard, "size": 10 * len(shard), "sha256": shard[0] * 64, "samples": samples, "part": part}


def _records_json() -> list[tuple[dict, dict | None]]:
    """(input, part) as extraction writes them, out of order: bad samples skipped, a truncated tar skipped whole."""
    return [(_input("b.tar", 5, "part-00001.parquet"), _part("part-00001.parquet", "b.tar", 3, {"empty-y": 2})),
            ({**_input("c.tar", None, None), "skipped": "truncated-shard"}, None),
            (_input("a.tar", 4, "part-00000.parquet"), _part("part-00000.parquet", "a.tar", 4, {}))]


def _dict_form(inputs: list[dict], parts: list[dict]) -> dict:
    """The manifest as extraction built it, a dict literal, before the entries were dataclasses."""
    return {"tool": "tokweight", "tool_version": tool_version(), "schema_version": SCHEMA_VERSION,
            "fingerprint": FP, "format": "parquet", "dtype": "float32", "units": "nats", "template_version": "t1",
            "checkpoint": {"path": "/ckpt", "fingerprint": FP, "model_config": {"d_model": 8}},
            "vocab": {"tokens": ["<pad>", "a"]}, "data_root": "/data", "inputs": inputs, "parts": parts,
            "skipped": {"empty-y": 2, "truncated-shard": 1},
            "stats": {"rows": 7, "tokens": 21, "b_sum": math.fsum([1.0, 4 / 3]),
                      "mean_example_mean_b": math.fsum([3 / 7, 4 / 7]) / 7},
            "complete": True, "extract_config": {"format": "parquet"}}


def test_manifest_json_is_the_dict_form_byte_for_byte(tmp_path):
    records = [Record(InputEntry.from_json(i), p and PartEntry.from_json(p)) for i, p in _records_json()]
    manifest = Manifest.of(FP, "parquet", PROVENANCE, records, complete=True)
    by_input = {i["name"]: (i, p) for i, p in _records_json()}
    inputs = [by_input[name][0] for name in ("a.tar", "b.tar", "c.tar")]  # with a part by part name, then skipped
    expected = _dict_form(inputs, [by_input["a.tar"][1], by_input["b.tar"][1]])
    assert manifest.to_json() == expected
    write_json_atomic(tmp_path / "new.json", manifest.to_json())
    write_json_atomic(tmp_path / "old.json", expected)
    assert (tmp_path / "new.json").read_bytes() == (tmp_path / "old.json").read_bytes()
    assert Manifest.from_json(json.loads((tmp_path / "new.json").read_text())) == manifest


def test_an_extracted_manifest_reads_back_to_the_same_bytes(world):
    path = fp_dir(world.store) / MANIFEST_NAME
    manifest = Manifest.from_json(json.loads(path.read_text()))
    assert manifest.provenance.extract_config is not None and len(manifest.parts) == 6
    assert checked_bytes(manifest.to_json()) == path.read_bytes()


@pytest.mark.parametrize("fmt", PART_FORMATS)
def test_writer_commits_what_readers_read(tmp_path, fmt):
    rows = example_rows(5, 30, shards=2)
    writer = StoreWriter(tmp_path, FP, fmt)
    writer.directory.mkdir(parents=True)
    records = []
    for i, shard in enumerate(sorted({r["shard"] for r in rows})):
        mine = [r for r in rows if r["shard"] == shard]
        source = InputEntry(shard, 1, "0" * 64, len(mine), writer.part_name(i))
        records.append(writer.write_part(rows_table(mine), source, skipped={"empty-y": 1}))
    assert read_records(writer.directory) == records  # journaled, not yet committed
    assert BaselineStore(tmp_path).fingerprints() == []
    manifest = writer.commit(records, PROVENANCE)
    view = BaselineStore(tmp_path).open()
    assert {k: v for k, v in view.manifest.items() if k != CHECKSUM_KEY} == manifest.to_json()
    assert read_records(writer.directory) == records  # kept: a damaged manifest is rebuilt from them
    assert [len(view.read_part(p.name)) for p in manifest.parts] == [p.rows for p in manifest.parts]
    assert manifest.stats()["rows"] == 30 and manifest.skipped() == {"empty-y": 2}


def test_an_exception_while_writing_a_part_leaves_nothing_visible(tmp_path, monkeypatch):
    writer = StoreWriter(tmp_path, FP, "parquet")
    writer.directory.mkdir(parents=True)

    def torn_write(table, tmp):  # half a file under the temporary name, then the writer fails
        tmp.write_bytes(b"PAR1" + b"\0" * 10)
        raise OSError("disk full")

    monkeypatch.setattr(PART_IO["parquet"], "write", torn_write)
    source = InputEntry("a.tar", 1, "0" * 64, 5, "part-00000.parquet")
    with pytest.raises(OSError, match="disk full"):
        writer.write_part(rows_table(example_rows(0, 5, shards=1)), source)
    assert sorted(p.name for p in writer.directory.iterdir()) == ["part-00000.parquet.tmp"]


def test_a_failed_commit_writes_no_manifest_and_keeps_the_journal(tmp_path):
    writer = StoreWriter(tmp_path, FP, "parquet")
    writer.directory.mkdir(parents=True)
    rows = example_rows(0, 5, shards=1)
    record = writer.write_part(rows_table(rows), InputEntry(rows[0]["shard"], 1, "0" * 64, 5, writer.part_name(0)))
    with pytest.raises(ValueError, match="Out of range float"):  # NaN is refused before anything is written
        writer.commit([record], Provenance("t", "none", {"lr": math.nan}, (), "none"))
    assert sorted(p.name for p in writer.directory.iterdir()) == ["part-00000.json", "part-00000.parquet"]
    assert BaselineStore(tmp_path).fingerprints() == [] and read_records(writer.directory) == [record]


def test_part_names_and_choices_come_from_the_formats():
    assert sorted(PART_IO) == sorted(PART_FORMATS)
    assert [part_index(f"part-00007.{fmt}") for fmt in PART_FORMATS] == [7] * len(PART_FORMATS)
    for name in ("part-00007.json", "part-00007.parquet.tmp", "part-7.parquet", "part-00007.csv"):
        with pytest.raises(ValueError, match="not a part name"):
            part_index(name)
    (option,) = [p for p in main.commands["extract"].params if p.name == "format"]
    assert tuple(option.type.choices) == PART_FORMATS
    result = CliRunner().invoke(main, ["extract", "--checkpoint", ".", "--data", ".", "--store", ".",
                                       "--format", "csv"])
    assert result.exit_code == 2 and "'csv' is not one of 'parquet', 'zarr'" in result.output
    with pytest.raises(ValueError, match="unknown part format 'csv'"):
        StoreWriter(".", FP, "csv")


def test_inputs_of_identical_content_are_refused(tmp_path):
    for name in ("a.tar", "b.tar"):
        (tmp_path / name).write_bytes(b"same")
    with pytest.raises(ValueError, match="'a.tar' and 'b.tar' have identical content"):
        hash_inputs({name: tmp_path / name for name in ("a.tar", "b.tar")})
