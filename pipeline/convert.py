"""JSON lines -> WebDataset shards in the SPEC §5 schema, with a report of what was changed.

Each line is an object with ``x`` and ``y`` (lists of string tokens), optional
``strategy`` and ``t0``, and an optional ``key`` (default ``line-<lineno>``). Keys are
made safe for WebDataset ('.', '/' and whitespace become '_') and made unique with a
``_dupN`` suffix. Lines are checked exactly as ``parse_sample`` checks shard samples.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Iterator

from pipeline.errors import SampleError
from pipeline.samples import Sample, sample_from_record
from pipeline.shards import prepare_output_dir, shard_name, write_shards
from store.manifest import write_json_atomic
from store.parts import sha256_path

_UNSAFE = re.compile(r"[.\s/]")
MAX_LISTED_BAD_LINES = 100  # in dataset.json; the count is always complete
ERROR_LISTED = 5  # bad lines named in the error message


class _Report:
    """What happened to the lines: bad ones by number, keys rewritten, symbols and strategy labels seen."""

    def __init__(self):
        self.bad: list[dict] = []
        self.bad_count = self.sanitized = self.deduplicated = self.blank = 0
        self.symbols: set[str] = set()
        self.strategies: set[str] = set()
        self.keys: set[str] = set()

    def add_bad(self, lineno: int, error: SampleError) -> None:
        self.bad_count += 1
        if len(self.bad) < MAX_LISTED_BAD_LINES:
            self.bad.append({"line": lineno, "reason": error.reason, "message": error.detail})

    def unique_key(self, key: str) -> str:
        """``key`` made WebDataset-safe and unused so far."""
        safe = _UNSAFE.sub("_", key)
        self.sanitized += safe != key
        if safe in self.keys:
            n = 1
            while f"{safe}_dup{n}" in self.keys:
                n += 1
            safe, self.deduplicated = f"{safe}_dup{n}", self.deduplicated + 1
        self.keys.add(safe)
        return safe


def _parse_line(line: bytes, lineno: int, report: _Report) -> Sample:
    """A Sample from one JSON line; SampleError (without a key yet) if it is bad."""
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SampleError("bad-json", f"json does not decode: {exc}") from None
    if not isinstance(record, dict):
        raise SampleError("wrong-type", f"line must hold a json object, got {type(record).__name__}")
    key = record.get("key", f"line-{lineno}")
    if not isinstance(key, str) or not key.strip():
        raise SampleError("bad-key", f"field 'key' must be a non-empty string, got {key!r}")
    sample = sample_from_record(record, _UNSAFE.sub("_", key))  # validated before the key is claimed
    return Sample(report.unique_key(key), sample.x, sample.y, sample.strategy, sample.t0)


def _good_samples(path: Path, report: _Report) -> Iterator[Sample]:
    """The file's valid lines as Samples, in order; bad lines go to ``report``."""
    with open(path, "rb") as lines:  # split on b"\n" only, decode line by line
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                report.blank += 1
                continue
            try:
                sample = _parse_line(line, lineno, report)
            except SampleError as error:
                report.add_bad(lineno, error)
                continue
            report.symbols.update(sample.x, sample.y)
            if sample.strategy is not None:
                report.strategies.add(sample.strategy)
            yield sample


def _bad_lines_error(path: Path, report: _Report) -> ValueError:
    listed = ", ".join(f"line {b['line']} ({b['reason']}: {b['message']})" for b in report.bad[:ERROR_LISTED])
    more = f", and {report.bad_count - ERROR_LISTED} more" if report.bad_count > ERROR_LISTED else ""
    return ValueError(f"{path}: {report.bad_count} bad line(s): {listed}{more}; "
                      "fix them, or skip them with `tokweight convert --on-bad skip` (on_bad='skip')")


def convert_jsonl(jsonl_path: str | Path, out_dir: str | Path, *, shard_size: int = 1000,
                  on_bad: str = "error", split: str = "all", overwrite: bool = False) -> dict:
    """Write ``out_dir/shard-NNNNNN.tar`` and then ``out_dir/dataset.json``; return the latter.

    ``on_bad="error"`` raises ValueError naming the file and the first bad line numbers
    (and leaves no shards behind); ``"skip"`` drops them and lists them in the report.
    The single split is recorded under ``split`` in ``dataset.json["splits"]``.
    """
    if on_bad not in ("error", "skip"):
        raise ValueError(f"on_bad must be 'error' or 'skip', got {on_bad!r}")
    path, out_dir = Path(jsonl_path), Path(out_dir)
    prepare_output_dir(out_dir, overwrite=overwrite)
    report = _Report()
    shards = write_shards(_good_samples(path, report), out_dir, shard_size=shard_size)
    if report.bad_count and on_bad == "error":
        for shard in shards:  # nothing was committed: dataset.json is not written
            shard.unlink()
        raise _bad_lines_error(path, report)
    if report.deduplicated:
        warnings.warn(f"{path}: {report.deduplicated} duplicate key(s) renamed with a _dupN suffix")
    n = len(report.keys)
    sha256, size = sha256_path(path)
    info = {
        "generator": "tokweight.convert",
        "source": {"name": path.name, "size": size, "sha256": sha256},
        "config": {"shard_size": shard_size, "on_bad": on_bad},
        "symbols": sorted(report.symbols),
        "strategies": sorted(report.strategies),  # pipeline.labels reads them: latent value k <-> strategies[k]
        "splits": {split: {"samples": n, "shards": [shard_name(out_dir, p) for p in shards]}},
        "bad_lines": {"count": report.bad_count, "lines": report.bad},
        "keys": {"sanitized": report.sanitized, "deduplicated": report.deduplicated},
        "blank_lines": report.blank,
    }
    write_json_atomic(out_dir / "dataset.json", info)
    return info
