"""The manifest of one fingerprint directory, and the journal records written before it.

Layout (SPEC §4, docs/store-contract.md):

    STORE/fingerprint=<fp>/manifest.json       the commit point, written last
    STORE/fingerprint=<fp>/part-NNNNN.parquet  (or part-NNNNN.zarr/) one per input shard
    STORE/fingerprint=<fp>/part-NNNNN.json     journal: written right after its part is
                                               published, folded into the manifest and
                                               removed when the manifest is committed

A journal record holds the finished part's manifest entry and its input's entry, so an
interrupted extraction (or the other ranks of a distributed one) can resume from what
is on disk without trusting anything that was not fsynced and renamed into place.
"""

from __future__ import annotations

import json
import math
import os
import re
from importlib.metadata import version
from pathlib import Path

from store.formats import PART_FORMATS, part_suffix
from store.parts import TMP_SUFFIX, fsync_dir, write_bytes_durable
from store.schema import SCHEMA_VERSION

TOOL = "tokweight"
MANIFEST_NAME = "manifest.json"
FINGERPRINT_PREFIX = "fingerprint="
PART_SUFFIXES = tuple(part_suffix(fmt) for fmt in PART_FORMATS)
RECORD_SUFFIX = ".json"
_NUMBERED = re.compile(r"^part-(\d{5})(\.\w+)$")  # part-NNNNN<suffix>: a part, or its journal record


def tool_version() -> str:
    return version(TOOL)


def fingerprint_dir(store: str | Path, fp: str) -> Path:
    return Path(store) / f"{FINGERPRINT_PREFIX}{fp}"


def part_name(index: int, fmt: str) -> str:
    if not 0 <= index < 100_000:
        raise ValueError(f"part index {index} does not fit part-NNNNN")
    return f"part-{index:05d}{part_suffix(fmt)}"


def _numbered(name: str, suffixes: tuple[str, ...]) -> int | None:
    """N of a name ``part-NNNNN<suffix>`` with one of ``suffixes``, else None."""
    match = _NUMBERED.match(name)
    return int(match.group(1)) if match and match.group(2) in suffixes else None


def part_index(name: str) -> int:
    index = _numbered(name, PART_SUFFIXES)
    if index is None:
        raise ValueError(f"{name!r} is not a part name ({' or '.join(f'part-NNNNN{s}' for s in PART_SUFFIXES)})")
    return index


def record_path(directory: Path, part: str) -> Path:
    """The journal record of a part: ``part-NNNNN.json`` beside it."""
    return directory / f"part-{part_index(part):05d}{RECORD_SUFFIX}"


def write_json_atomic(path: Path, obj: dict) -> None:
    """Canonical JSON (sorted keys) to ``<path>.tmp``, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    write_bytes_durable(tmp, (json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n").encode())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_manifest(directory: Path) -> dict | None:
    """The committed manifest of a fingerprint directory, or None if there is none."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: unreadable manifest ({e})") from None


def check_schema_version(manifest: dict, directory: Path) -> None:
    """Refuse a manifest whose parts have another column set than this tokweight's PART_SCHEMA."""
    found = manifest.get("schema_version")
    if found != SCHEMA_VERSION:
        raise ValueError(f"{directory / MANIFEST_NAME}: store schema version {found}, but this tokweight "
                         f"reads and writes version {SCHEMA_VERSION} (store/schema.py); re-extract into a new "
                         f"store, or delete {directory} and run `tokweight extract` again")


def read_records(directory: Path) -> list[dict]:
    """Journal records of this schema version that parse; a torn, foreign or older one is ignored
    (its part is re-extracted)."""
    records = []
    for path in sorted(directory.glob("part-*.json")):
        if _numbered(path.name, (RECORD_SUFFIX,)) is None:
            continue
        try:
            record = json.loads(path.read_text())
            if {"part", "input"} <= set(record) and record.get("schema_version") == SCHEMA_VERSION:
                records.append(record)
        except ValueError:
            pass
    return records


def stats(parts: list[dict]) -> dict:
    """Store totals from part entries; ``mean_example_mean_b`` is the dataset mean of mean_t b_t."""
    rows = sum(p["rows"] for p in parts)
    sum_means = math.fsum(p["sum_example_mean_b"] for p in parts)
    return {"rows": rows, "tokens": sum(p["tokens"] for p in parts),
            "b_sum": math.fsum(p["b_sum"] for p in parts),
            "mean_example_mean_b": sum_means / rows if rows else None}


def skipped_totals(parts: list[dict], inputs: list[dict]) -> dict:
    """Skipped samples per reason over all parts, plus whole inputs skipped (e.g. truncated tars)."""
    totals: dict[str, int] = {}
    for entry in parts:
        for reason, n in entry["skipped"].items():
            totals[reason] = totals.get(reason, 0) + n
    for entry in inputs:
        if entry.get("part") is None and entry.get("skipped"):
            totals[entry["skipped"]] = totals.get(entry["skipped"], 0) + 1
    return dict(sorted(totals.items()))


def list_fingerprint_dirs(store: str | Path) -> list[Path]:
    root = Path(store)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(FINGERPRINT_PREFIX))


def stray_parts(directory: Path, manifest: dict) -> list[str]:
    """Part-named files or directories that the manifest does not list."""
    listed = {p["name"] for p in manifest.get("parts", [])}
    return sorted(p.name for p in directory.iterdir()
                  if _numbered(p.name, PART_SUFFIXES) is not None and p.name not in listed)
