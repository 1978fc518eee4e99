"""Check a fingerprint directory, every byte: the manifest against its own checksum, every part
against the manifest, every journal record against its own checksum and the manifest.

A problem names the file it concerns. ``tokweight extract`` re-creates damaged or
missing parts (it trusts a part only if its sha256 matches the record), rebuilds a
manifest that does not verify from the journal records, and rewrites a damaged record
with its part, so the usual fix for any problem listed here is to re-run the same extraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from tokweight.store.manifest import (MANIFEST_NAME, PartEntry, read_manifest, read_record, record_paths, stats,
                                      stray_parts)
from tokweight.store.parts import read_part, sha256_path
from tokweight.store.schema import TOKEN_LIST_COLUMNS


@dataclass(frozen=True)
class Problem:
    part: str | None  # the damaged part, or None for the manifest as a whole
    message: str

    def __str__(self) -> str:
        return f"{self.part}: {self.message}" if self.part else self.message


def _check_content(path: Path, entry: dict, fmt: str, version: int) -> list[str]:
    """Row and token counts, list lengths and finiteness of a part whose checksum matched."""
    try:
        table = read_part(path, fmt, version=version)
    except Exception as e:  # a part that matches its sha256 but does not parse was written wrong
        return [f"does not read as {fmt}: {e}"]
    found = []
    T = table.column("T").to_numpy()
    if len(table) != entry["rows"]:
        found.append(f"{len(table)} rows, manifest says {entry['rows']}")
    if int(T.sum()) != entry["tokens"]:
        found.append(f"{int(T.sum())} tokens, manifest says {entry['tokens']}")
    for name in TOKEN_LIST_COLUMNS:
        lengths = pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False)
        if not np.array_equal(lengths, T):
            found.append(f"column {name} has list lengths that differ from T")
    b = table.column("b").combine_chunks().flatten().to_numpy()
    if not np.isfinite(b).all():
        found.append("b holds NaN or inf")
    if set(table.column("shard").to_pylist()) - {entry["input"]}:
        found.append(f"rows name a shard other than {entry['input']}")
    return found


def verify_dir(directory: str | Path) -> list[Problem]:
    """Every problem found in one fingerprint directory (empty: the store is intact)."""
    directory = Path(directory)
    try:
        manifest = read_manifest(directory)
    except ValueError as e:
        return [Problem(MANIFEST_NAME, str(e)), *_check_records(directory, None)]
    if manifest is None:
        return [Problem(None, f"{directory}: no {MANIFEST_NAME} (extraction never finished)"),
                *_check_records(directory, None)]
    problems = []
    if not manifest.get("complete"):
        problems.append(Problem(None, "manifest says the store is incomplete"))
    for entry in manifest["parts"]:
        problems += [Problem(entry["name"], m) for m in _check_part(directory, entry, manifest)]
    problems += _check_records(directory, manifest)
    problems += [Problem(name, "not listed in the manifest (stray part)") for name in stray_parts(directory, manifest)]
    listed = {p["name"] for p in manifest["parts"]}
    problems += [Problem(e["part"], f"input {e['name']} points to a part the manifest does not list")
                 for e in manifest["inputs"] if e.get("part") is not None and e["part"] not in listed]
    expected = stats(map(PartEntry.from_json, manifest["parts"]))
    if any(not math.isclose(expected[k] or 0, manifest["stats"][k] or 0, rel_tol=1e-12) for k in expected):
        problems.append(Problem(None, f"manifest stats {manifest['stats']} differ from its parts' sum {expected}"))
    return problems


def _check_part(directory: Path, entry: dict, manifest: dict) -> list[str]:
    """What is wrong with one listed part: missing, another sha256 or size, or content that disagrees."""
    path = directory / entry["name"]
    if not path.exists():
        return ["missing"]
    sha, size = sha256_path(path)
    if sha != entry["sha256"] or size != entry["bytes"]:
        return [f"checksum mismatch ({size} bytes, sha256 {sha[:12]}...; "
                f"manifest: {entry['bytes']} bytes, {entry['sha256'][:12]}...)"]
    return _check_content(path, entry, manifest["format"], manifest["schema_version"])


def _check_records(directory: Path, manifest: dict | None) -> list[Problem]:
    """Journal records that do not verify, or that disagree with the manifest (None: there is none that
    verifies, so each record is checked against its part's file instead)."""
    listed = {p["name"]: p for p in manifest["parts"]} if manifest else {}
    problems = []
    for path in record_paths(directory):
        try:
            record = read_record(path)
        except ValueError as e:
            problems.append(Problem(path.name, str(e)))
            continue
        entry = record.part.to_json()
        if record.part.name in listed and listed[record.part.name] != entry:
            problems.append(Problem(path.name, f"disagrees with the manifest's entry of {record.part.name}"))
        elif record.part.name not in listed:
            part = directory / record.part.name
            if not part.exists() or sha256_path(part)[0] != record.part.sha256:
                problems.append(Problem(path.name, f"its part {record.part.name} is missing or has another sha256"))
    return problems
