"""JSONL converter: counts, safe unique keys, bad lines by number, nothing committed on error."""

from __future__ import annotations

import json

import pytest

from pipeline.convert import convert_jsonl
from pipeline.samples import Sample
from pipeline.shards import count_samples, iter_samples, resolve_shards

GOOD = {"x": ["a", "b"], "y": ["b", "a"]}
LINES = [
    json.dumps({**GOOD, "key": "ex1", "strategy": "reverse", "t0": 0}),  # 1
    json.dumps({**GOOD, "key": "doc.v1.0001"}),  # 2: dotted key
    json.dumps({"x": ["a"]}),  # 3: missing y
    "",  # 4: blank, ignored
    json.dumps({"x": ["c"], "y": []}),  # 5: empty y
    '{"x": ["a"], "y": ["a"',  # 6: bad json
    json.dumps({"x": ["c", "d"], "y": ["d"]}),  # 7: no key -> line-7
    json.dumps({**GOOD, "key": "doc/v1 0001"}),  # 8: same safe key as line 2
    json.dumps({**GOOD, "key": "ex1", "t0": "0"}),  # 9: wrong type
    json.dumps({"x": ["e"], "y": ["e", "f"], "key": "ex1"}),  # 10: duplicate key
]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def test_skip_mode_counts_keys_and_report(jsonl, tmp_path):
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="2 duplicate key"):
        info = convert_jsonl(jsonl, out, shard_size=2, on_bad="skip")
    assert json.loads((out / "dataset.json").read_text()) == info
    assert info["generator"] == "tokweight.convert"
    assert [(b["line"], b["reason"]) for b in info["bad_lines"]["lines"]] == [
        (3, "missing-field"), (5, "empty-y"), (6, "bad-json"), (9, "wrong-type")]
    assert info["bad_lines"]["count"] == 4 and info["blank_lines"] == 1
    assert info["keys"] == {"sanitized": 2, "deduplicated": 2}
    assert info["symbols"] == ["a", "b", "c", "d", "e", "f"]
    split = info["splits"]["all"]
    assert split["samples"] == 5 and split["shards"] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    root, shards = resolve_shards(out)
    assert sum(count_samples(p) for p in shards) == 5
    got = [s for _, s in iter_samples(shards)]
    assert got == [
        Sample("ex1", ("a", "b"), ("b", "a"), "reverse", 0),
        Sample("doc_v1_0001", ("a", "b"), ("b", "a")),
        Sample("line-7", ("c", "d"), ("d",)),
        Sample("doc_v1_0001_dup1", ("a", "b"), ("b", "a")),
        Sample("ex1_dup1", ("e",), ("e", "f")),
    ]


def test_error_mode_names_file_and_lines_and_commits_nothing(jsonl, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        convert_jsonl(jsonl, out, shard_size=2)
    message = str(info.value)
    assert "data.jsonl" in message and "4 bad line(s)" in message
    for fragment in ("line 3 (missing-field", "line 5 (empty-y", "line 6 (bad-json", "line 9 (wrong-type"):
        assert fragment in message
    assert list(out.iterdir()) == []  # no shards, no dataset.json


def test_clean_file_is_deterministic_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "clean.jsonl"
    path.write_text("".join(json.dumps({"x": [str(i)], "y": [str(i), "z"]}) + "\n" for i in range(5)))
    a = convert_jsonl(path, tmp_path / "a", shard_size=3)
    b = convert_jsonl(path, tmp_path / "b", shard_size=3)
    assert a == b and a["bad_lines"] == {"count": 0, "lines": []}
    for name in ("shard-000000.tar", "shard-000001.tar", "dataset.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(FileExistsError):
        convert_jsonl(path, tmp_path / "a")
    assert convert_jsonl(path, tmp_path / "a", overwrite=True)["splits"]["all"]["shards"] == ["shard-000000.tar"]
    with pytest.raises(ValueError, match="on_bad"):
        convert_jsonl(path, tmp_path / "c", on_bad="ignore")
