"""JSONL converter: counts, keys cleaned only into free names, bad lines by number, nothing committed on error."""

from __future__ import annotations

import json
import warnings

import pytest

from tokweight.pipeline.data.config import ConvertConfig
from tokweight.pipeline.data.convert import run as convert
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import iter_samples, resolve_shards


def convert_jsonl(jsonl, out, **options) -> dict:
    """`tokweight convert` of ``jsonl`` into ``out``."""
    return convert(ConvertConfig(str(jsonl), str(out), **options))


def samples_in(path) -> int:
    """The samples a shard yields (a damaged shard raises)."""
    return sum(1 for _ in iter_samples([str(path)]))

GOOD = {"x": ["a", "b"], "y": ["b", "a"]}
LINES = [
    json.dumps({**GOOD, "key": "ex1", "strategy": "reverse", "t0": 0}),  # 1
    json.dumps({**GOOD, "key": "doc.v1.0001"}),  # 2: dotted key, its clean form is free
    json.dumps({"x": ["a"]}),  # 3: missing y
    "",  # 4: blank, ignored
    json.dumps({"x": ["c"], "y": []}),  # 5: empty y
    '{"x": ["a"], "y": ["a"',  # 6: bad json
    json.dumps({"x": ["c", "d"], "y": ["d"]}),  # 7: no key -> line-7
    json.dumps({**GOOD, "key": "doc/v1 0001"}),  # 8: cleans to what line 2 took
    json.dumps({**GOOD, "key": "ex1", "t0": "0"}),  # 9: wrong type
    json.dumps({"x": ["e"], "y": ["e", "f"], "key": "ex1"}),  # 10: duplicate key
]
ONE_SPLIT = dict(val_fraction=0, test_fraction=0)  # everything in train/, in line order


def write_lines(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path):
    return write_lines(tmp_path / "data.jsonl", LINES)


def test_skip_mode_counts_keys_and_report(jsonl, tmp_path):
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning about duplicates: a clash is a bad line
        info = convert_jsonl(jsonl, out, shard_size=2, on_bad="skip", **ONE_SPLIT)
    assert json.loads((out / "dataset.json").read_text()) == info
    assert info["generator"] == "tokweight.convert"
    assert [(b["line"], b["reason"]) for b in info["bad_lines"]["lines"]] == [
        (3, "missing-field"), (5, "empty-y"), (6, "bad-json"), (8, "duplicate-key"), (9, "wrong-type"),
        (10, "duplicate-key")]
    messages = {b["line"]: b["message"] for b in info["bad_lines"]["lines"]}
    assert messages[8] == "key 'doc/v1 0001' cleans to 'doc_v1_0001', already the key of line 2"
    assert messages[10] == "key 'ex1' is already the key of line 1"
    assert info["bad_lines"]["count"] == 6 and info["blank_lines"] == 1
    assert info["key_map"] == {"doc.v1.0001": "doc_v1_0001"}
    assert info["symbols"] == ["a", "b", "c", "d"] and info["strategies"] == ["reverse"]
    assert info["splits"] == {"train": {"samples": 3, "shards": ["train/shard-000000.tar", "train/shard-000001.tar"]}}
    _, shards = resolve_shards(out)
    assert sum(samples_in(p) for p in shards) == 3
    assert [s for _, s in iter_samples(shards)] == [
        Sample("ex1", ("a", "b"), ("b", "a"), "reverse", 0),
        Sample("doc_v1_0001", ("a", "b"), ("b", "a")),
        Sample("line-7", ("c", "d"), ("d",)),
    ]


def test_error_mode_names_file_and_lines_and_commits_nothing(jsonl, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        convert_jsonl(jsonl, out, shard_size=2)
    message = str(info.value)
    assert "data.jsonl" in message and "6 bad line(s)" in message and "and 1 more" in message
    for fragment in ("line 3 (missing-field", "line 5 (empty-y", "line 6 (bad-json", "line 8 (duplicate-key",
                     "line 9 (wrong-type"):
        assert fragment in message
    assert not out.exists()  # no shards, no dataset.json, no empty folder


def test_clean_file_is_deterministic_and_refuses_to_overwrite(tmp_path):
    path = write_lines(tmp_path / "clean.jsonl", [{"x": [str(i)], "y": [str(i), "z"]} for i in range(5)])
    a = convert_jsonl(path, tmp_path / "a", shard_size=3, **ONE_SPLIT)
    b = convert_jsonl(path, tmp_path / "b", shard_size=3, **ONE_SPLIT)
    assert a == b and a["bad_lines"] == {"count": 0, "lines": []} and a["key_map"] == {}
    for name in ("train/shard-000000.tar", "train/shard-000001.tar", "dataset.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(FileExistsError, match=r"holds a dataset \(train/shard-000000.tar, \.\.\.\): choose an empty "
                                              r"folder or pass --overwrite"):
        convert_jsonl(path, tmp_path / "a")
    again = convert_jsonl(path, tmp_path / "a", overwrite=True, **ONE_SPLIT)
    assert again["splits"]["train"]["shards"] == ["train/shard-000000.tar"]
    assert sorted(p.name for p in (tmp_path / "a" / "train").iterdir()) == ["shard-000000.tar"]  # the old 2nd is gone
    with pytest.raises(ValueError, match="on_bad"):
        convert_jsonl(path, tmp_path / "c", on_bad="ignore")
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------- key cleaning never renames a legal key

CLASH = [
    {"key": "doc.v1.0001", "x": ["a"], "y": ["dotted"]},  # 1: cleans to line 2's own key
    {"key": "doc_v1_0001", "x": ["a"], "y": ["legal"]},  # 2: a legal key, later in the file
    {"key": "doc.v2", "x": ["a"], "y": ["free"]},  # 3: cleans to a free key
]


def test_a_dotted_key_never_takes_a_legal_key_of_a_later_line(tmp_path):
    path = write_lines(tmp_path / "clash.jsonl", CLASH)
    with pytest.raises(ValueError) as error:
        convert_jsonl(path, tmp_path / "refused")
    assert ("1 bad line(s): line 1 (duplicate-key: key 'doc.v1.0001' cleans to 'doc_v1_0001', "
            "already the key of line 2)") in str(error.value)
    assert not (tmp_path / "refused").exists()
    info = convert_jsonl(path, tmp_path / "out", on_bad="skip", **ONE_SPLIT)
    stored = {s.key: s.y for _, s in iter_samples(resolve_shards(tmp_path / "out")[1])}
    assert stored == {"doc_v1_0001": ("legal",), "doc_v2": ("free",)}  # the legal key kept its line
    assert info["key_map"] == {"doc.v2": "doc_v2"}
    assert [(b["line"], b["reason"]) for b in info["bad_lines"]["lines"]] == [(1, "duplicate-key")]


def test_a_legal_key_on_a_bad_line_still_blocks_its_clean_form(tmp_path):
    """Fixing line 2 later must not rename line 1's sample: line 1 is refused now too."""
    lines = [{"key": "k.1", "x": ["a"], "y": ["b"]}, {"key": "k_1", "x": ["a"], "y": []}]
    info = convert_jsonl(write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out", on_bad="skip", **ONE_SPLIT)
    assert [(b["line"], b["reason"]) for b in info["bad_lines"]["lines"]] == [(1, "duplicate-key"), (2, "empty-y")]
    assert info["splits"]["train"]["samples"] == 0 and info["key_map"] == {}
