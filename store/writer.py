"""Writing one fingerprint directory, in the manner of mosaicml streaming's MDSWriter: parts first, the manifest last.

    hash_inputs   input tars -> InputShard: name, size and sha256, by which a store knows its inputs
    url_inputs    input URLs -> InputShard: name and URL; size and sha256 are those of the bytes streamed
    write_part    a PART_SCHEMA table -> its part (temp name, fsync, rename), then its journal record
    commit        every input's record -> manifest.json (temp name, fsync, rename), the commit point;
                  the journal records it folds in stay, so that a damaged manifest can be rebuilt

Readers open only what a manifest lists, so an exception before ``commit`` has written
the manifest commits nothing, and a journal record exists only for a part in place.
An OSError while writing (a full disk, an I/O error) becomes a ``StoreWriteError``: one
line naming the file, saying that nothing of it was committed and what to do.
Extraction (pipeline/extract/extract.py), the test stores (tests/support/fixtures_sql.py) and the SQL
benchmark (scripts/bench_sql.py) all write through ``StoreWriter``.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokweight.store.formats import check_format
from tokweight.store.manifest import (MANIFEST_NAME, InputEntry, Manifest, PartEntry, Provenance, Record, fingerprint_dir,
                            part_name, record_path, write_checked_json)
from tokweight.store.parts import sha256_path, write_part


@dataclass(frozen=True)
class InputShard:
    """An input tar: where it is now, and how the store knows it (name, size, sha256; a URL's also its URL)."""

    path: Path | None  # a local tar; None for a URL
    name: str  # relative to the data root, e.g. "train/shard-000000.tar"
    size: int | None  # None: a URL not streamed yet
    sha256: str | None  # of the bytes read; None: a URL not streamed yet
    url: str | None = None  # http(s):// or pipe: (pipeline/data/urls.py)

    @property
    def source(self) -> str:
        """What a reader opens: the URL, or the local path."""
        return self.url if self.url is not None else str(self.path)

    def identity(self) -> tuple:
        """``InputEntry.identity`` of this input: a URL is known before it is read, a local tar by content."""
        return ("url", self.url) if self.url is not None else (self.size, self.sha256)

    def entry(self, samples: int | None, part: str | None, skipped: str | None = None) -> InputEntry:
        return InputEntry(self.name, self.size, self.sha256, samples, part, skipped, self.url)


def hash_inputs(paths: Mapping[str, Path]) -> list[InputShard]:
    """The input tars (name -> path, in that order), hashed; two of the same content are refused."""
    shards = []
    for name, path in paths.items():
        sha, size = sha256_path(path)
        shards.append(InputShard(path, name, size, sha))
    refuse_identical(shards)
    return shards


def url_inputs(urls: Mapping[str, str]) -> list[InputShard]:
    """The input URLs (name -> URL, in that order), not read: their size and sha256 come from the stream
    that extracts them (``refuse_identical`` then checks them)."""
    return [InputShard(None, name, None, None, url) for name, url in urls.items()]


def refuse_identical(shards: Iterable[InputShard | InputEntry]) -> None:
    """ValueError naming two inputs of identical content (size and sha256), wherever they were read from."""
    seen: dict[tuple, str] = {}
    for s in shards:
        if s.sha256 is None:
            continue
        where = s.name if s.url is None else f"{s.name} ({s.url})"
        if (s.size, s.sha256) in seen:
            raise ValueError(f"shards {seen[(s.size, s.sha256)]!r} and {where!r} have identical content; "
                             "a store matches shards by content, so each input must be distinct")
        seen[(s.size, s.sha256)] = where


class StoreWriteError(OSError):
    """Writing a part, a journal record or the manifest failed; the message is one line."""


@contextmanager
def _committing(what: str, path: Path):
    """Turn an OSError while writing ``what`` at ``path`` into a StoreWriteError that says what is left and
    what to do."""
    try:
        yield
    except OSError as e:
        name = errno.errorcode.get(e.errno, "error")
        raise StoreWriteError(e.errno, f"{path}: {e.strerror or e} ({name}) while writing {what}; it was not "
                                       "committed and the store's manifest is unchanged: free space or fix the "
                                       "disk, then re-run the same `tokweight extract`, which resumes") from e


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
        with _committing(f"part {source.part}", self.directory / source.part):
            written = write_part(table, self.directory / source.part, self.format)
        record = Record(source, part_entry(table, source, written, skipped or {}, skipped_keys or {}))
        path = record_path(self.directory, source.part)
        with _committing(f"the journal record of {source.part}", path):
            write_checked_json(path, record.to_json(self.fingerprint))
        return record

    def commit(self, records: Iterable[Record], provenance: Provenance, complete: bool = True) -> Manifest:
        """Write the manifest of ``records``: the commit point."""
        manifest = Manifest.of(self.fingerprint, self.format, provenance, records, complete)
        path = self.directory / MANIFEST_NAME
        with _committing("the manifest", path):
            write_checked_json(path, manifest.to_json())
        return manifest
