"""The manifest of one fingerprint directory, and the journal records written before it.

Layout (docs/contract.md §4, docs/store-contract.md):

    STORE/fingerprint=<fp>/manifest.json       the commit point, written last
    STORE/fingerprint=<fp>/part-NNNNN.parquet  (or part-NNNNN.zarr/) one per input shard
    STORE/fingerprint=<fp>/part-NNNNN.json     journal: written right after its part is
                                               published, folded into the manifest, kept

A journal record holds the finished part's manifest entry and its input's entry, so an
interrupted extraction (or the other ranks of a distributed one) can resume from what
is on disk without trusting anything that was not fsynced and renamed into place, and a
manifest that fails its checksum can be rebuilt from the records without re-extracting.

The manifest and the journal records are "checked JSON" (``checked_bytes``): canonical JSON
(sorted keys, indent 1, a final newline) holding, under CHECKSUM_KEY, the sha256 of the
canonical JSON of every other key. A reader accepts such a file only if its bytes are
exactly ``checked_bytes`` of what they parse to, so any changed byte is caught, whether it
changes a value, the checksum or only the layout. Manifests of schema versions before 3
have no checksum: they are accepted if their bytes are canonical.

The entries are frozen dataclasses (``InputEntry``, ``PartEntry``, ``Record``,
``Provenance``, ``Manifest``) whose ``to_json`` is the JSON of the contract, key for key;
``store.writer.StoreWriter`` writes them. Readers (store.baseline_store) keep the parsed
JSON as it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

from tokweight.store.durable import canonical_bytes, write_bytes_atomic
from tokweight.store.formats import PART_FORMATS, part_suffix
from tokweight.store.schema import READABLE_VERSIONS, SCHEMA_VERSION

TOOL = "tokweight"
MANIFEST_NAME = "manifest.json"
FINGERPRINT_PREFIX = "fingerprint="
DTYPE, UNITS = "float32", "nats"  # of every stored surprisal and entropy
PART_SUFFIXES = tuple(part_suffix(fmt) for fmt in PART_FORMATS)
RECORD_SUFFIX = ".json"
UNCHECKED_VERSIONS = (1, 2)  # schema versions whose manifests were written without a checksum
CHECKSUM_KEY = "content_sha256"  # of a manifest or journal record: sha256 of the canonical JSON of the other keys
REPAIR = ("re-run the `tokweight extract` that wrote this store (the same --checkpoint, --data and --store): "
          "it rebuilds the manifest from the verified parts and journal records")
_NUMBERED = re.compile(r"^part-(\d{5})(\.\w+)$")  # part-NNNNN<suffix>: a part, or its journal record


URL_PREFIXES = ("http://", "https://", "pipe:")
"""Inputs read through a URL (pipeline/data/urls.py): the store knows them by URL, not by where a file lies."""


def is_url(location: object) -> bool:
    """Whether a shard's location is a URL (http, https or a ``pipe:`` command) rather than a local path."""
    return isinstance(location, str) and location.startswith(URL_PREFIXES)


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


def checked_bytes(obj: dict) -> bytes:
    """The canonical JSON of ``obj`` with CHECKSUM_KEY set to the sha256 of the canonical JSON of the rest."""
    body = {k: v for k, v in obj.items() if k != CHECKSUM_KEY}
    return canonical_bytes({**body, CHECKSUM_KEY: hashlib.sha256(canonical_bytes(body)).hexdigest()})


class DamagedFile(ValueError):
    """A manifest or journal record whose bytes are not those its content gives."""


def parse_checked(path: Path, raw: bytes) -> dict:
    """The object of a checked JSON file's bytes; DamagedFile naming ``path`` unless the bytes are exactly
    ``checked_bytes`` of it (for a manifest of one of UNCHECKED_VERSIONS without a checksum: its canonical
    bytes; a single flipped bit cannot both make a manifest such a one and remove its checksum)."""
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        has_checksum = CHECKSUM_KEY in obj or obj.get("schema_version") not in UNCHECKED_VERSIONS
        expected = checked_bytes(obj) if has_checksum else canonical_bytes(obj)
    except (ValueError, UnicodeDecodeError) as e:
        raise DamagedFile(f"{path}: does not parse as JSON ({e})") from None
    if expected != raw:
        what = "its content_sha256 or layout does not match its content" if has_checksum else "it is not canonical JSON"
        raise DamagedFile(f"{path}: {what}")
    return obj


def write_checked_json(path: Path, obj: dict) -> None:
    """``checked_bytes(obj)``, written atomically and durably (``store.durable``): how a manifest or
    journal record is committed."""
    write_bytes_atomic(path, checked_bytes(obj))


# ---------------------------------------------------------------- entries


@dataclass(frozen=True)
class InputEntry:
    """An input shard as a manifest lists it; a store matches a local shard by (size, sha256), not by name,
    and a URL's by its URL (its bytes are known only once streamed, and then must hash to ``sha256``)."""

    name: str  # relative to the data root, e.g. "train/shard-000000.tar"
    size: int
    sha256: str  # of the bytes read: a URL's computed while it was streamed
    samples: int | None  # in the tar: rows + skipped samples; None for a shard skipped whole
    part: str | None  # the part made of it; None for a shard skipped whole
    skipped: str | None = None  # why a shard has no part ("truncated-shard"); not in the JSON otherwise
    url: str | None = None  # where a URL input was read from; not in the JSON for a local shard

    def identity(self) -> tuple:
        """What a run's input is matched by: its URL, or a local tar's (size, sha256)."""
        return ("url", self.url) if self.url is not None else (self.size, self.sha256)

    def to_json(self) -> dict:
        entry = asdict(self)
        for optional in ("skipped", "url"):
            if entry[optional] is None:
                del entry[optional]
        return entry

    @classmethod
    def from_json(cls, obj: dict) -> InputEntry:
        return cls(**obj)


@dataclass(frozen=True)
class PartEntry:
    """A published part as a manifest lists it: what `store verify` checks the file against."""

    name: str
    input: str  # name of the input shard it was made of
    sha256: str  # of the file, or of a Zarr directory's files (store.parts.sha256_path)
    bytes: int
    rows: int
    tokens: int  # sum of T over the rows
    b_sum: float  # nats, over every token
    sum_example_mean_b: float  # sum over rows of mean_t b_t: divided by rows, the mean of per-example means
    skipped: dict[str, int]  # bad samples left out of the part, per reason
    skipped_keys: dict[str, list[str]] = field(default_factory=dict)
    """Their keys per reason, in file order (a duplicate's further copies included): what training and
    evaluation skip without error, because extraction did. Not in the JSON when empty, so a store without
    skips is written as before."""

    def to_json(self) -> dict:
        entry = asdict(self)
        if not self.skipped_keys:
            del entry["skipped_keys"]
        return entry

    @classmethod
    def from_json(cls, obj: dict) -> PartEntry:
        return cls(**obj)


@dataclass(frozen=True)
class Record:
    """An input and the part made of it: what a journal file holds, and what a manifest is built from."""

    input: InputEntry
    part: PartEntry | None  # None: the input was skipped whole (such a record is never journaled)

    def to_json(self, fingerprint: str) -> dict:
        """The journal file of a written part, stamped with the fingerprint and schema version it was written under."""
        return {"input": self.input.to_json(), "part": self.part.to_json(), "fingerprint": fingerprint,
                "schema_version": SCHEMA_VERSION}

    @classmethod
    def from_json(cls, obj: dict) -> Record:
        return cls(InputEntry.from_json(obj["input"]), PartEntry.from_json(obj["part"]))


@dataclass(frozen=True)
class Provenance:
    """What a store's parts were computed from, as its manifest records it."""

    template_version: str
    checkpoint_path: str
    model_config: dict
    vocab: tuple[str, ...]  # tokens in id order
    data_root: str
    extract_config: dict | None = None  # the extraction's config; None for stores written by tests and benchmarks
    template: dict | None = None
    """The checkpoint's format (``pipeline.tokens.templates.Template.to_json``), which train and eval read back;
    None for stores written by tests and benchmarks, and before it was recorded: the built-in template."""

    def to_json(self, fingerprint: str) -> dict:
        """The manifest's keys for it (the checkpoint's fingerprint is the directory's)."""
        out = {"template_version": self.template_version,
               "checkpoint": {"path": self.checkpoint_path, "fingerprint": fingerprint,
                              "model_config": self.model_config},
               "vocab": {"tokens": list(self.vocab)}, "data_root": self.data_root}
        optional = {"extract_config": self.extract_config, "template": self.template}
        return out | {key: value for key, value in optional.items() if value is not None}

    @classmethod
    def from_json(cls, manifest: dict) -> Provenance:
        checkpoint = manifest["checkpoint"]
        return cls(manifest["template_version"], checkpoint["path"], checkpoint["model_config"],
                   tuple(manifest["vocab"]["tokens"]), manifest["data_root"], manifest.get("extract_config"),
                   manifest.get("template"))


@dataclass(frozen=True)
class Manifest:
    """manifest.json (docs/store-contract.md); ``schema_version`` is that of the parts' columns (store/schema.py)."""

    fingerprint: str
    format: str
    provenance: Provenance
    inputs: tuple[InputEntry, ...]  # those with a part by part name, then those skipped whole by name
    parts: tuple[PartEntry, ...]  # by name
    complete: bool  # every input of the run has a part or a recorded skip
    tool_version: str = field(default_factory=tool_version)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def of(cls, fingerprint: str, fmt: str, provenance: Provenance, records: Iterable[Record],
           complete: bool) -> Manifest:
        records = list(records)
        inputs = sorted((r.input for r in records), key=lambda e: (e.part is None, e.part or "", e.name))
        parts = sorted((r.part for r in records if r.part is not None), key=lambda p: p.name)
        return cls(fingerprint, fmt, provenance, tuple(inputs), tuple(parts), complete)

    def records(self) -> list[Record]:
        parts = {p.name: p for p in self.parts}
        return [Record(e, parts.get(e.part)) for e in self.inputs]

    def stats(self) -> dict:
        return stats(self.parts)

    def skipped(self) -> dict:
        return skipped_totals(self.parts, self.inputs)

    def skipped_by_input(self) -> dict[str, dict[str, int]]:
        """{input name: {reason: n}} for the inputs with skipped samples or skipped whole (counted once)."""
        by_input = {p.input: dict(p.skipped) for p in self.parts if p.skipped}
        whole = {e.name: {e.skipped: 1} for e in self.inputs if e.part is None and e.skipped}
        return dict(sorted({**by_input, **whole}.items()))

    def to_json(self) -> dict:
        return {"tool": TOOL, "tool_version": self.tool_version, "schema_version": self.schema_version,
                "fingerprint": self.fingerprint, "format": self.format, "dtype": DTYPE, "units": UNITS,
                **self.provenance.to_json(self.fingerprint),
                "inputs": [e.to_json() for e in self.inputs], "parts": [p.to_json() for p in self.parts],
                "skipped": self.skipped(), "stats": self.stats(), "complete": self.complete}

    @classmethod
    def from_json(cls, obj: dict) -> Manifest:
        """The manifest of ``obj``; its "skipped" and "stats" are recomputed from the entries, never read."""
        return cls(obj["fingerprint"], obj["format"], Provenance.from_json(obj),
                   tuple(map(InputEntry.from_json, obj["inputs"])), tuple(map(PartEntry.from_json, obj["parts"])),
                   obj["complete"], obj["tool_version"], obj["schema_version"])


# ---------------------------------------------------------------- reading


def read_manifest(directory: Path) -> dict | None:
    """The committed manifest of a fingerprint directory, or None if there is none; DamagedFile (one line,
    naming the file and the repair) if it does not verify (``parse_checked``), ValueError if it verifies
    but is of a schema version this tokweight cannot read (a newer one's: never rebuilt over)."""
    path = directory / MANIFEST_NAME
    if not path.is_file():
        return None
    raw = path.read_bytes()
    try:
        manifest = parse_checked(path, raw)
    except DamagedFile as e:
        raise DamagedFile(f"{e}: the manifest does not verify; {REPAIR}") from None
    if manifest.get("schema_version") not in READABLE_VERSIONS:
        raise ValueError(f"{path}: store schema version {manifest.get('schema_version')!r}, but this tokweight "
                          f"reads versions {READABLE_VERSIONS} (store/schema.py); re-extract into a new store")
    return manifest


def damaged_manifest(directory: Path) -> str | None:
    """Why the directory's manifest.json does not verify, or None (it verifies, or there is none)."""
    try:
        read_manifest(directory)
    except DamagedFile as e:
        return str(e)
    return None


def check_schema_version(manifest: dict, directory: Path) -> None:
    """Refuse to write into a store whose parts have another column set than this tokweight's PART_SCHEMA."""
    found = manifest.get("schema_version")
    if found != SCHEMA_VERSION:
        raise ValueError(f"{directory / MANIFEST_NAME}: store schema version {found}, but this tokweight "
                         f"writes version {SCHEMA_VERSION} (store/schema.py); re-extract into a new "
                         f"store, or delete {directory} and run `tokweight extract` again")


def load_manifest(directory: Path) -> Manifest | None:
    """The committed manifest as a ``Manifest`` for a writer: None if there is none or it does not verify
    (the writer rebuilds it), refused if it is of another schema version."""
    try:
        manifest = read_manifest(directory)
    except DamagedFile:
        return None
    if manifest is None:
        return None
    check_schema_version(manifest, directory)
    return Manifest.from_json(manifest)


def record_paths(directory: Path) -> list[Path]:
    """The journal record files of a fingerprint directory, by name."""
    return [p for p in sorted(directory.glob("part-*.json")) if _numbered(p.name, (RECORD_SUFFIX,)) is not None]


def read_record(path: Path) -> Record:
    """A journal record; DamagedFile if it does not verify, ValueError if it is of another schema version."""
    record = parse_checked(path, path.read_bytes())
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: a journal record of schema version {record.get('schema_version')!r}")
    try:
        return Record.from_json(record)
    except (KeyError, TypeError) as e:
        raise DamagedFile(f"{path}: not a journal record ({e!r})") from None


def read_records(directory: Path) -> list[Record]:
    """Journal records of this schema version that verify; a torn, damaged, foreign or older one is ignored
    (its part is re-extracted)."""
    return [r for r in map(_journal_record, record_paths(directory)) if r is not None]


def _journal_record(path: Path) -> Record | None:
    try:
        return read_record(path)
    except ValueError:  # torn, damaged, or not the entries of this schema version
        return None


def stats(parts: Iterable[PartEntry]) -> dict:
    """Store totals from part entries; ``mean_example_mean_b`` is the dataset mean of mean_t b_t."""
    parts = list(parts)
    rows = sum(p.rows for p in parts)
    sum_means = math.fsum(p.sum_example_mean_b for p in parts)
    return {"rows": rows, "tokens": sum(p.tokens for p in parts), "b_sum": math.fsum(p.b_sum for p in parts),
            "mean_example_mean_b": sum_means / rows if rows else None}


def skipped_totals(parts: Iterable[PartEntry], inputs: Iterable[InputEntry]) -> dict:
    """Skipped samples per reason over all parts, plus whole inputs skipped (e.g. truncated tars)."""
    totals: dict[str, int] = {}
    for entry in parts:
        for reason, n in entry.skipped.items():
            totals[reason] = totals.get(reason, 0) + n
    for entry in inputs:
        if entry.part is None and entry.skipped:
            totals[entry.skipped] = totals.get(entry.skipped, 0) + 1
    return dict(sorted(totals.items()))


def list_fingerprint_dirs(store: str | Path) -> list[Path]:
    root = Path(store)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(FINGERPRINT_PREFIX))


def pending_records(directory: Path, manifest: dict | None) -> list[Record]:
    """Journal records of parts that the manifest does not list: finished by a run that has not committed."""
    listed = {p["name"] for p in (manifest or {}).get("parts", [])}
    return [r for r in read_records(directory) if r.part.name not in listed]


def stray_parts(directory: Path, manifest: dict) -> list[str]:
    """Part-named files or directories that the manifest does not list."""
    listed = {p["name"] for p in manifest.get("parts", [])}
    return sorted(p.name for p in directory.iterdir()
                  if _numbered(p.name, PART_SUFFIXES) is not None and p.name not in listed)
