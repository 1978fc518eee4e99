"""Writing one fingerprint directory, in the manner of mosaicml streaming's MDSWriter: parts first, the manifest last.

    hash_inputs   input tars -> InputShard: name, size and sha256, by which a store knows its inputs
    write_part    a PART_SCHEMA table -> its part (temp name, fsync, rename), then its journal record
    commit        every input's record -> manifest.json (temp name, fsync, rename), the commit point;
                  the journal records it folds in are removed

Readers open only what a manifest lists, so an exception before ``commit`` has written
the manifest commits nothing, and a journal record exists only for a part in place.
Extraction (pipeline/extract.py), the test stores (tests/fixtures_sql.py) and the SQL
benchmark (scripts/bench_sql.py) all write through ``StoreWriter``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokweight.store.formats import check_format
from tokweight.store.manifest import (MANIFEST_NAME, InputEntry, Manifest, PartEntry, Provenance, Record, fingerprint_dir,
                            part_name, record_path, write_json_atomic)
from tokweight.store.parts import sha256_path, write_part


@dataclass(frozen=True)
class InputShard:
    """An input tar: where it is now, and how the store knows it (name, size, sha256)."""

    path: Path
    name: str  # relative to the data root, e.g. "train/shard-000000.tar"
    size: int
    sha256: str

    def entry(self, samples: int | None, part: str | None, skipped: str | None = None) -> InputEntry:
        return InputEntry(self.name, self.size, self.sha256, samples, part, skipped)


def hash_inputs(paths: Mapping[str, Path]) -> list[InputShard]:
    """The input tars (name -> path, in that order), hashed; two of the same content are refused."""
    shards = []
    for name, path in paths.items():
        sha, size = sha256_path(path)
        shards.append(InputShard(path, name, size, sha))
    seen: dict[tuple, str] = {}
    for s in shards:
        if (s.size, s.sha256) in seen:
            raise ValueError(f"shards {seen[(s.size, s.sha256)]!r} and {s.name!r} have identical content; "
                             "a store matches shards by content, so each input must be distinct")
        seen[(s.size, s.sha256)] = s.name
    return shards


def sum_example_mean_b(table: pa.Table) -> float:
    """Sum over rows of mean_t b_t (float64): divided by rows, the dataset mean of per-example means."""
    if not len(table):
        return 0.0
    return float(np.sum(table.column("b_sum").to_numpy() / table.column("T").to_numpy()))


def part_entry(table: pa.Table, source: InputEntry, written: dict, skipped: Mapping[str, int],
               skipped_keys: Mapping[str, list[str]]) -> PartEntry:
    """The manifest entry of ``table`` published as ``source.part``; ``written``: its {"sha256", "bytes"}."""
    return PartEntry(name=source.part, input=source.name, **written, rows=len(table),
                     tokens=int(np.sum(table.column("T").to_numpy())),
                     b_sum=float(np.sum(table.column("b_sum").to_numpy())),
                     sum_example_mean_b=sum_example_mean_b(table), skipped=dict(sorted(skipped.items())),
                     skipped_keys={r: list(keys) for r, keys in sorted(skipped_keys.items())})


class StoreWriter:
    """Writes the parts and the manifest of ``STORE/fingerprint=<fp>/`` in one format.

    Holds no state besides its directory: the ranks of a distributed extraction each
    write parts with their own writer, and rank 0 commits the records of all of them.
    """

    def __init__(self, store: str | Path, fingerprint: str, fmt: str):
        self.directory = fingerprint_dir(store, fingerprint)
        self.fingerprint, self.format = fingerprint, check_format(fmt)

    def part_name(self, index: int) -> str:
        return part_name(index, self.format)

    def write_part(self, table: pa.Table, source: InputEntry, skipped: Mapping[str, int] | None = None,
                   skipped_keys: Mapping[str, list[str]] | None = None) -> Record:
        """Publish ``table`` as the part ``source.part``, then its journal record; the record.

        skipped: bad samples of the input left out of the table, per reason; skipped_keys: their keys.
        """
        written = write_part(table, self.directory / source.part, self.format)
        record = Record(source, part_entry(table, source, written, skipped or {}, skipped_keys or {}))
        write_json_atomic(record_path(self.directory, source.part), record.to_json(self.fingerprint))
        return record

    def commit(self, records: Iterable[Record], provenance: Provenance, complete: bool = True) -> Manifest:
        """Write the manifest of ``records`` (the commit point), then remove the journal records it folds in."""
        manifest = Manifest.of(self.fingerprint, self.format, provenance, records, complete)
        write_json_atomic(self.directory / MANIFEST_NAME, manifest.to_json())
        for part in manifest.parts:
            record_path(self.directory, part.name).unlink(missing_ok=True)
        return manifest
