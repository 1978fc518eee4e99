"""convert's splits (key hash, split field), split_urls on split and plain folders, and the CLI's one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import tokweight.pipeline.data.convert
from tokweight.cli import main
from tokweight.pipeline.data.config import ConvertConfig, key_unit
from tokweight.pipeline.data.convert import run as convert
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_samples, resolve_shards, write_shards
from tokweight.pipeline.data.splits import split_urls


def convert_jsonl(jsonl, out, **options) -> dict:
    """`tokweight convert` of ``jsonl`` into ``out``."""
    return convert(ConvertConfig(str(jsonl), str(out), **options))


def write_lines(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def line(key, **fields):
    return {"key": key, "x": ["a"], "y": ["b"], **fields}


def stored_splits(out) -> dict[str, str]:
    """key -> the split folder its shard lies in."""
    root, shards = resolve_shards(out)
    return {s.key: url.relative_to(root).parts[0] for url in shards for _, s in iter_samples([url])}


# ---------------------------------------------------------------- by key hash


def test_split_by_key_hash_is_seeded_and_adding_lines_moves_no_key(tmp_path):
    first = [line(f"k{i}") for i in range(600)]
    info = convert_jsonl(write_lines(tmp_path / "a.jsonl", first), tmp_path / "a", shard_size=100)
    assert list(info["splits"]) == ["train", "val", "test"]
    assert info["config"]["split"] == {"by": "key-hash", "hash": "blake2b('<seed>:<key>', 8 bytes) / 2**64",
                                       "val_fraction": 0.1, "test_fraction": 0.1, "seed": 0}
    counts = {name: split["samples"] for name, split in info["splits"].items()}
    assert sum(counts.values()) == 600 and 30 <= counts["val"] <= 90 and 30 <= counts["test"] <= 90
    before = stored_splits(tmp_path / "a")
    for key, split in before.items():  # the documented rule, recomputable from the key alone
        unit = key_unit(0, key)
        assert split == ("val" if unit < 0.1 else "test" if unit < 0.2 else "train")
    more = [line(f"new{i}") for i in range(300)]
    write_lines(tmp_path / "b.jsonl", more[:150] + first + more[150:])  # lines added before and after
    convert_jsonl(tmp_path / "b.jsonl", tmp_path / "b", shard_size=100)
    after = stored_splits(tmp_path / "b")
    assert {key: after[key] for key in before} == before
    convert_jsonl(tmp_path / "a.jsonl", tmp_path / "c", shard_size=100, seed=1)
    assert stored_splits(tmp_path / "c") != before  # another seed, another division


def test_fractions_choose_the_splits_and_are_checked(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [line(f"k{i}") for i in range(20)])
    only_train = convert_jsonl(path, tmp_path / "train-only", val_fraction=0, test_fraction=0)
    assert list(only_train["splits"]) == ["train"] and only_train["splits"]["train"]["samples"] == 20
    all_test = convert_jsonl(path, tmp_path / "test-only", val_fraction=0, test_fraction=1)
    assert list(all_test["splits"]) == ["test"] and all_test["splits"]["test"]["samples"] == 20
    for bad, match in ((dict(val_fraction=1.5), "val_fraction must lie in"),
                       (dict(val_fraction=0.6, test_fraction=0.6), "at most 1"),
                       (dict(split_field="split", val_fraction=0.2), "drop --val-fraction")):
        with pytest.raises(ValueError, match=match):
            convert_jsonl(path, tmp_path / "refused", **bad)
    assert not (tmp_path / "refused").exists()


# ---------------------------------------------------------------- by a field of the line


def test_split_field_takes_each_lines_own_split_and_refuses_bad_names_by_line(tmp_path):
    lines = [line("a", part="val"), line("b", part="train"), line("c", part="holdout-2"), line("d", part="Train"),
             line("e"), line("f", part="train")]
    path = write_lines(tmp_path / "in.jsonl", lines)
    with pytest.raises(ValueError, match=r"2 bad line\(s\): line 4 \(wrong-type: field 'part' must name a split "
                                         r"with \[a-z0-9_-\] only, got 'Train'\), line 5 \(missing-field"):
        convert_jsonl(path, tmp_path / "refused", split_field="part")
    info = convert_jsonl(path, tmp_path / "out", split_field="part", on_bad="skip")
    assert {name: split["samples"] for name, split in info["splits"].items()} == {"train": 2, "val": 1, "holdout-2": 1}
    assert list(info["splits"]) == ["train", "val", "holdout-2"]  # train, val, test first, then the others
    assert info["config"]["split"] == {"by": "field", "field": "part"}
    assert stored_splits(tmp_path / "out") == {"a": "val", "b": "train", "c": "holdout-2", "f": "train"}
    assert split_urls(tmp_path / "out", "holdout-2") == tuple(str(tmp_path / "out" / p)
                                                             for p in info["splits"]["holdout-2"]["shards"])
    with pytest.raises(ValueError, match="sample field"):
        convert_jsonl(path, tmp_path / "refused", split_field="y")


# ---------------------------------------------------------------- split_urls


def test_an_unknown_split_is_an_error_listing_the_splits(tmp_path):
    convert_jsonl(write_lines(tmp_path / "in.jsonl", [line(f"k{i}") for i in range(60)]), tmp_path / "data")
    test_urls = split_urls(tmp_path / "data", "test")
    assert test_urls and all("/test/" in url for url in test_urls)
    for missing in ("no-such-split", "all"):
        with pytest.raises(ValueError) as error:
            split_urls(tmp_path / "data", missing)
        assert str(error.value) == (f"{tmp_path / 'data'} has no split {missing!r}: its splits are train, val, test; "
                                    "pass one of them")


def test_a_plain_folder_of_shards_is_every_split_as_before(tmp_path):
    paths = write_shards([Sample(f"k{i}", ("a",), ("b",)) for i in range(3)], tmp_path / "flat", shard_size=2)
    for split in ("train", "test", "anything"):
        assert split_urls(tmp_path / "flat", split) == tuple(str(p) for p in paths)


def test_a_split_listed_in_dataset_json_but_left_empty_exists(tmp_path):
    info = convert_jsonl(write_lines(tmp_path / "in.jsonl", [line("k0")]), tmp_path / "data")
    empty = [name for name, split in info["splits"].items() if split["samples"] == 0]
    assert len(empty) == 2  # one line: one split holds it
    with pytest.raises(FileNotFoundError, match="no .tar shards"):  # not "no split": the split exists, empty
        split_urls(tmp_path / "data", empty[0])


# ---------------------------------------------------------------- the command line


def invoke(*args):
    return CliRunner().invoke(main, ["convert", *map(str, args)])


def assert_one_line_error(result, expected: str):
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # click's exit, not a crash
    assert "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"Error: {expected}"]


def test_cli_refuses_a_folder_holding_a_dataset_in_one_line_and_overwrites_on_request(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [line(f"k{i}") for i in range(50)])
    out = tmp_path / "out"
    first = invoke("--jsonl", path, "--out", out, "--shard-size", 5)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["splits"] == {k: v["samples"] for k, v in
                                                  json.loads((out / "dataset.json").read_text())["splits"].items()}
    again = invoke("--jsonl", path, "--out", out)
    assert_one_line_error(again, f"{out} already holds a dataset (train/shard-000000.tar, ...): choose an empty "
                                 "folder or pass --overwrite")
    replaced = invoke("--jsonl", path, "--out", out, "--overwrite", "--val-fraction", 0, "--test-fraction", 0)
    assert replaced.exit_code == 0, replaced.output
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.tar")) == ["train/shard-000000.tar"]
    assert list(json.loads((out / "dataset.json").read_text())["splits"]) == ["train"]


def test_cli_bad_lines_and_bad_options_are_one_line_and_leave_no_folder(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [line("k.1"), line("k_1"), '{"x": '])
    out = tmp_path / "new" / "out"
    result = invoke("--jsonl", path, "--out", out)
    assert_one_line_error(result, f"{path}: 2 bad line(s): line 1 (duplicate-key: key 'k.1' cleans to 'k_1', "
                                  "already the key of line 2), line 3 (bad-json: json does not decode: Expecting "
                                  "value: line 1 column 7 (char 6)); fix them, or skip them with `tokweight convert "
                                  "--on-bad skip` (on_bad='skip')")
    assert not (tmp_path / "new").exists()
    options = invoke("--jsonl", path, "--out", out, "--split-field", "part", "--test-fraction", 0.2)
    assert_one_line_error(options, "--split-field takes each line's split from the line: drop --val-fraction and "
                                   "--test-fraction")
    assert not (tmp_path / "new").exists()


def test_a_write_that_fails_midway_leaves_no_shard_and_no_folder(tmp_path, monkeypatch):
    def failing_write(samples, out_dir, **kw):
        write_shards(samples, out_dir, **kw)  # one split written, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tokweight.pipeline.data.convert, "write_shards", failing_write)
    path = write_lines(tmp_path / "in.jsonl", [line(f"k{i}") for i in range(10)])
    result = invoke("--jsonl", path, "--out", tmp_path / "new" / "out")
    assert_one_line_error(result, "[Errno 28] No space left on device")
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    assert invoke("--jsonl", path, "--out", existing).exit_code == 1
    assert [p.name for p in existing.iterdir()] == ["notes.txt"]  # the folder it did not create stays, as it was
