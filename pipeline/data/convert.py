"""JSON lines or Parquet -> WebDataset shards (docs/contract.md §5), split into train/val/test, with a report.

Each line is an object with ``x`` and ``y`` (lists of string tokens), optional
``strategy`` and ``t0``, and an optional ``key`` (default ``line-<lineno>``). Lines are
checked exactly as ``parse_sample`` checks shard samples. Parquet rows are records the
same way, their columns mapped to those fields (``columns``; a null is an absent field, a
row's default key ``row-<n>``), read row group by row group; everything said below of
lines holds of rows (pipeline.data.convert_sources).

Keys. A legal key (no '.', '/' or whitespace) is stored unchanged. Any other key is
cleaned (those characters become '_') only when the clean key is free: no line of the
file holds it as its own key (a bad line too, so fixing that line never changes what
another line is called) and no earlier line took it. Otherwise the line is bad
(``duplicate-key``), like a key that repeats an earlier one. ``dataset.json["key_map"]``
records ``{original: stored}`` for every cleaned key.

Splits go to ``OUT/<split>/shard-NNNNNN.tar`` (the layout ``tokweight synth`` writes),
either by a hash of (seed, stored key), so a key's split never changes when lines are
added or removed, or by a field of each line (``split_field``).

Two passes over the file: the first checks every line and decides its key and split
(every legal key must be known before a dotted key may take its clean form), so a bad
line under ``on_bad="error"`` stops the run before anything is written; the second
writes each split's shards, decoding only that split's lines again. Neither holds the
file: per line, only its split and its stored key are kept.
"""

from __future__ import annotations

import heapq
import re
from pathlib import Path
from typing import Iterator

from tokweight.pipeline.data.convert_sources import JsonLines, ParquetRows
from tokweight.pipeline.data.config import ConvertConfig, FieldSplit, HashSplit
from tokweight.pipeline.data.errors import SampleError
from tokweight.pipeline.data.samples import Sample, sample_from_record
from tokweight.pipeline.data.shards import prepare_output_dir, shard_name, write_shards
from tokweight.store.durable import write_json_atomic

_UNSAFE = re.compile(r"[.\s/]")
SPLIT_ORDER = ("train", "val", "test")  # dataset.json lists these first, then any others by name
MAX_LISTED_BAD_LINES = 100  # in dataset.json; the count is always complete
ERROR_LISTED = 5  # bad lines named in the error message


def source(cfg: ConvertConfig) -> JsonLines | ParquetRows:
    """The lines or rows ``cfg`` converts."""
    if cfg.jsonl is not None:
        return JsonLines(cfg.jsonl)
    return ParquetRows(cfg.parquet, cfg.columns, cfg.split_field)


def clean_key(key: str) -> str:
    """``key`` with '.', '/' and whitespace made '_' (WebDataset splits a member name at its first dot)."""
    return _UNSAFE.sub("_", key)


# ---------------------------------------------------------------- split rules


def _split_order(name: str) -> tuple[int, str]:
    return (SPLIT_ORDER.index(name) if name in SPLIT_ORDER else len(SPLIT_ORDER), name)


# ---------------------------------------------------------------- config


# ---------------------------------------------------------------- pass one: every line's fate


class _BadLines:
    """Bad lines: the count, and the first ``MAX_LISTED_BAD_LINES`` by line number (found in any order)."""

    def __init__(self, source: JsonLines | ParquetRows):
        self.source = source
        self.count = 0
        self._kept: list[tuple[int, str, str]] = []  # a heap of (-line, reason, message): the largest line on top

    def add(self, lineno: int, error: SampleError) -> None:
        self.count += 1
        heapq.heappush(self._kept, (-lineno, error.reason, error.detail))
        if len(self._kept) > MAX_LISTED_BAD_LINES:
            heapq.heappop(self._kept)

    def listed(self) -> list[dict]:
        """{"line": N} (Parquet: {"file", "row"}), "reason", "message" of each listed bad line, in file order."""
        return [{**self.source.entry(-neg), "reason": reason, "message": message}
                for neg, reason, message in sorted(self._kept, reverse=True)]

    def named(self) -> list[str]:
        """'line 3 (reason: message)' of each listed bad line, as errors name them."""
        listed = sorted(self._kept, reverse=True)  # by line
        return [f"{self.source.where(-neg)} ({reason}: {message})" for neg, reason, message in listed]


def _line_key(record: dict, lineno: int, source: JsonLines | ParquetRows) -> str:
    """The line's own key, as written (not yet cleaned)."""
    key = record.get("key", source.default_key(lineno))
    if not isinstance(key, str) or not key.strip():
        raise SampleError("bad-key", f"field 'key' must be a non-empty string, got {key!r}")
    return key


class _Plan:
    """Pass one: each line's split (None: blank, bad or refused) and stored key, before a shard is written."""

    def __init__(self, rule: HashSplit | FieldSplit, source: JsonLines | ParquetRows):
        self.rule, self.source = rule, source
        self.split_of_line: list[str | None] = []  # index lineno - 1
        self.bad, self.blank = _BadLines(source), 0
        self.claimed: dict[str, int] = {}  # legal key -> first line holding it, bad lines too: never cleaned into
        self.taken: dict[str, int] = {}  # stored key -> the line that will be written under it
        self.dotted: list[tuple[int, str, str]] = []  # (line, key, split): decided once every legal key is known
        self.key_map: dict[str, str] = {}  # original -> stored, for cleaned keys

    def read(self) -> _Plan:
        for lineno, line in self.source.records():
            self.split_of_line.append(None)
            if self.source.blank(line):
                self.blank += 1
                continue
            try:
                self._check(lineno, self.source.decode(line))
            except SampleError as error:
                self.bad.add(lineno, error)
        self._clean_dotted()
        return self

    def _check(self, lineno: int, record: dict) -> None:
        key = _line_key(record, lineno, self.source)
        clean = clean_key(key)
        if clean == key:
            self.claimed.setdefault(key, lineno)
        sample_from_record(record, clean)  # SampleError if bad
        split = self.rule.split_of(clean, record)
        if clean != key:
            self.dotted.append((lineno, key, split))
        elif key in self.taken:
            holder = self.source.where(self.taken[key])
            raise SampleError("duplicate-key", f"key {key!r} is already the key of {holder}")
        else:
            self._place(lineno, key, split)

    def _clean_dotted(self) -> None:
        for lineno, key, split in self.dotted:
            clean = clean_key(key)
            holder = self.claimed.get(clean) or self.taken.get(clean)
            if holder:
                self.bad.add(lineno, SampleError("duplicate-key", f"key {key!r} cleans to {clean!r}, already the key "
                                                                  f"of {self.source.where(holder)}"))
            else:
                self._place(lineno, clean, split)
                self.key_map[key] = clean

    def _place(self, lineno: int, key: str, split: str) -> None:
        self.taken[key] = lineno
        self.split_of_line[lineno - 1] = split

    def split_names(self) -> list[str]:
        seen = set(self.split_of_line) - {None}
        return sorted(seen | set(self.rule.names()), key=_split_order)


def _bad_lines_error(bad: _BadLines) -> ValueError:
    listed = ", ".join(bad.named()[:ERROR_LISTED])
    more = f", and {bad.count - ERROR_LISTED} more" if bad.count > ERROR_LISTED else ""
    return ValueError(f"{bad.source.label}: {bad.count} bad {bad.source.unit}(s): {listed}{more}; "
                      "fix them, or skip them with `tokweight convert --on-bad skip` (on_bad='skip')")


# ---------------------------------------------------------------- the output folder


def _refuse_existing(out_dir: Path, overwrite: bool) -> None:
    """FileExistsError where ``out_dir`` holds a dataset: readers glob every *.tar below it, old and new alike."""
    if overwrite or not out_dir.is_dir():
        return
    held = sorted((p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*")
                   if p.suffix == ".tar" or p.name == "dataset.json"),
                  key=lambda name: (name == "dataset.json", _split_order(name.split("/")[0]), name))  # train's first
    if held:
        more = ", ..." if len(held) > 1 else ""
        raise FileExistsError(f"{out_dir} already holds a dataset ({held[0]}{more}): "
                              "choose an empty folder or pass --overwrite")


def _first_missing(folder: Path) -> Path | None:
    """The topmost of ``folder`` and its parents that does not exist yet: what creating it creates."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _remove_if_empty(folder: Path) -> None:
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def _undo(out_dir: Path, names: list[str], created: Path | None) -> None:
    """After a failed write: its shards go, then the folders it left empty, up to the first it created."""
    for name in names:
        for leftover in (out_dir / name).glob("shard-*.tar*"):  # .tmp too; no older shard survived prepare
            leftover.unlink()
        _remove_if_empty(out_dir / name)
    if created is None:
        return
    for folder in (out_dir, *out_dir.parents):
        _remove_if_empty(folder)
        if folder == created:
            break


# ---------------------------------------------------------------- pass two: writing


class _Vocabulary:
    """Symbols and strategy labels of the samples written (dataset.json lists both sorted)."""

    def __init__(self):
        self.symbols: set[str] = set()
        self.strategies: set[str] = set()

    def note(self, sample: Sample) -> Sample:
        self.symbols.update(sample.x, sample.y)
        if sample.strategy is not None:
            self.strategies.add(sample.strategy)
        return sample


def _split_samples(plan: _Plan, name: str, vocab: _Vocabulary) -> Iterator[Sample]:
    """Split ``name``'s samples in line order, under their stored keys (its lines were checked in pass one)."""
    source = plan.source
    for split, (lineno, line) in zip(plan.split_of_line, source.records()):
        if split == name:
            record = source.decode(line)
            yield vocab.note(sample_from_record(record, clean_key(_line_key(record, lineno, source))))


def _write_splits(cfg: ConvertConfig, plan: _Plan, vocab: _Vocabulary) -> dict:
    out_dir = Path(cfg.out)
    counts = {name: plan.split_of_line.count(name) for name in plan.split_names()}
    splits = {}
    for name, samples in counts.items():
        shards = write_shards(_split_samples(plan, name, vocab), out_dir / name, shard_size=cfg.shard_size)
        splits[name] = {"samples": samples, "shards": [shard_name(out_dir, p) for p in shards]}
    return splits


def _write_dataset(cfg: ConvertConfig, plan: _Plan) -> dict:
    """Shards first, then ``dataset.json``, the commit point."""
    prepare_output_dir(cfg.out, overwrite=cfg.overwrite)
    vocab = _Vocabulary()
    splits = _write_splits(cfg, plan, vocab)
    unit = plan.source.unit
    info = {
        "generator": "tokweight.convert",
        "source": plan.source.describe(),
        "config": {"shard_size": cfg.shard_size, "on_bad": cfg.on_bad, "split": plan.rule.describe(),
                   **({"columns": dict(cfg.columns)} if cfg.parquet is not None else {})},
        "symbols": sorted(vocab.symbols),
        "strategies": sorted(vocab.strategies),  # pipeline.data.labels reads them: label k is strategies[k]
        "splits": splits,
        "key_map": plan.key_map,
        f"bad_{unit}s": {"count": plan.bad.count, f"{unit}s": plan.bad.listed()},
        **({"blank_lines": plan.blank} if cfg.jsonl is not None else {}),
    }
    write_json_atomic(Path(cfg.out) / "dataset.json", info)
    return info


def run(cfg: ConvertConfig) -> dict:
    """Write ``cfg.out/<split>/shard-NNNNNN.tar`` and then ``cfg.out/dataset.json``; return the latter.

    FileExistsError if ``cfg.out`` holds a dataset and ``overwrite`` is off; ValueError
    naming the file and the first bad lines under ``on_bad="error"``. Either way, and on
    any failure while writing, no shard and no folder this call created is left behind.
    """
    out_dir = Path(cfg.out)
    _refuse_existing(out_dir, cfg.overwrite)
    plan = _Plan(cfg.rule(), source(cfg)).read()
    if plan.bad.count and cfg.on_bad == "error":
        raise _bad_lines_error(plan.bad)
    created = _first_missing(out_dir)
    try:
        return _write_dataset(cfg, plan)
    except BaseException:
        _undo(out_dir, plan.split_names(), created)
        raise
