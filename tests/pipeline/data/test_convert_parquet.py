"""convert --parquet: columns mapped to the sample fields, row group by row group, the shards JSON lines give, and bad
rows named by file and row as bad lines are by line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.config import ConvertConfig
from tokweight.pipeline.data.convert import run as convert
from tokweight.pipeline.data.shards import iter_samples, resolve_shards

ONE_SPLIT = dict(val_fraction=0, test_fraction=0)
ROWS = [{"id": f"q{i}", "question": ["a", "b"][: 1 + i % 2], "answer": ["c"] * (1 + i % 3),
         "label": ["copy", None][i % 2], "t0": i % 3} for i in range(20)]


def write_parquet(path, rows, row_group_size=3):
    """A Parquet file of several row groups (3 rows each by default)."""
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def shard_bytes(out) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.tar"))}


def test_parquet_rows_give_the_shards_of_the_same_json_lines(tmp_path):
    path = write_parquet(tmp_path / "data.parquet", ROWS)
    assert pq.ParquetFile(path).metadata.num_row_groups == 7
    columns = {"key": "id", "x": "question", "y": "answer", "strategy": "label"}
    info = convert(ConvertConfig(None, str(tmp_path / "p"), parquet=str(path), columns=columns, shard_size=6))
    lines = [{"key": r["id"], "x": r["question"], "y": r["answer"], "t0": r["t0"],
              **({"strategy": r["label"]} if r["label"] else {})} for r in ROWS]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    from_lines = convert(ConvertConfig(str(tmp_path / "data.jsonl"), str(tmp_path / "j"), shard_size=6))
    assert shard_bytes(tmp_path / "p") == shard_bytes(tmp_path / "j") and shard_bytes(tmp_path / "p")
    assert info["splits"] == from_lines["splits"] and info["strategies"] == ["copy"]
    assert info["source"]["parquet"][0]["name"] == "data.parquet" and info["config"]["columns"] == columns
    assert info["bad_rows"] == {"count": 0, "rows": []} and "blank_lines" not in info


def test_bad_rows_are_named_by_row_and_skipped_on_request(tmp_path):
    rows = [{"key": "k1", "x": ["a"], "y": ["b"]}, {"key": "k2", "x": ["a"], "y": None},
            {"key": "k3", "x": ["a"], "y": []}, {"key": "k1", "x": ["c"], "y": ["d"]},
            {"key": "k.5", "x": ["a"], "y": ["b"]}, {"key": None, "x": ["a"], "y": ["e"]}]
    path = write_parquet(tmp_path / "rows.parquet", rows, row_group_size=2)
    with pytest.raises(ValueError) as error:
        convert(ConvertConfig(None, str(tmp_path / "refused"), parquet=str(path)))
    assert str(error.value) == (f"{path}: 3 bad row(s): row 2 (missing-field: field 'y' is missing), row 3 (empty-y: "
                                "field 'y' is empty), row 4 (duplicate-key: key 'k1' is already the key of row 1); fix "
                                "them, or skip them with `tokweight convert --on-bad skip` (on_bad='skip')")
    assert not (tmp_path / "refused").exists()
    info = convert(ConvertConfig(None, str(tmp_path / "out"), parquet=str(path), on_bad="skip", **ONE_SPLIT))
    assert [(b["file"], b["row"], b["reason"]) for b in info["bad_rows"]["rows"]] == [
        ("rows.parquet", 2, "missing-field"), ("rows.parquet", 3, "empty-y"), ("rows.parquet", 4, "duplicate-key")]
    assert info["key_map"] == {"k.5": "k_5"}
    stored = [s.key for _, s in iter_samples(resolve_shards(tmp_path / "out")[1])]
    assert stored == ["k1", "k_5", "row-6"]  # a null key: the row's own


def test_a_glob_of_files_is_read_in_name_order_and_rows_are_named_in_their_file(tmp_path):
    write_parquet(tmp_path / "b.parquet", [{"x": ["a"], "y": ["b"]}, {"x": ["a"], "y": []}])
    write_parquet(tmp_path / "a.parquet", [{"x": ["c"], "y": ["d"]}])
    with pytest.raises(ValueError, match=r"1 bad row\(s\): b.parquet row 2 \(empty-y"):
        convert(ConvertConfig(None, str(tmp_path / "o"), parquet=str(tmp_path / "*.parquet")))
    convert(ConvertConfig(None, str(tmp_path / "o"), parquet=str(tmp_path / "*.parquet"), on_bad="skip", **ONE_SPLIT))
    assert [s.key for _, s in iter_samples(resolve_shards(tmp_path / "o")[1])] == ["a-row-1", "b-row-1"]


def test_missing_columns_and_bad_options_are_one_line_and_write_nothing(tmp_path):
    path = write_parquet(tmp_path / "qa.parquet", [{"question": ["a"], "answer": ["b"]}])
    cases = [
        ([], f"{path}: no column for x, y; its columns are question, answer: map them with --columns "
             "x=COLUMN,y=COLUMN"),
        (["--columns", "x=question,y=reply"], f"{path}: no column for y (column 'reply'); its columns are question, "
                                              "answer: map them with --columns x=COLUMN,y=COLUMN"),
        (["--columns", "x=question,why=answer"], "--columns maps 'why', which is no sample field"),
        (["--columns", "x:question"], "give FIELD=COLUMN pairs separated by commas"),
    ]
    for extra, expected in cases:
        result = CliRunner().invoke(main, ["convert", "--parquet", str(path), "--out", str(tmp_path / "o"), *extra])
        assert result.exit_code != 0 and expected in result.stderr and "Traceback" not in result.output, result.stderr
    assert not (tmp_path / "o").exists()
    both = CliRunner().invoke(main, ["convert", "--parquet", str(path), "--jsonl", str(path),
                                     "--out", str(tmp_path / "o")])
    assert both.exit_code == 1 and "either a JSON lines file (--jsonl) or Parquet (--parquet)" in both.stderr
    ok = CliRunner().invoke(main, ["convert", "--parquet", str(path), "--columns", "x=question,y=answer",
                                   "--out", str(tmp_path / "o")])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["bad_rows"] == 0 and sum(json.loads(ok.stdout)["splits"].values()) == 1
