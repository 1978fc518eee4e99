"""Reading a baseline store (docs/store-contract.md): what training and inspection use.

Readers open a store only if its manifest verifies (store.manifest.read_manifest: its
own checksum), open only the parts it lists, and check each part's sha256 against the
manifest before parsing it, so a torn, damaged or stray file is an error naming the file
and its repair, never silently wrong numbers. A store of an older schema version reads
like a current one (store.parts.read_part computes the columns it lacks). Local input shards are matched by
content (size, then sha256 of the tar), so a moved dataset still joins and a changed one never does; a URL by
the URL extraction read it from (its reader then checks the bytes it streams against the entry's sha256).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokweight.store.manifest import FINGERPRINT_PREFIX, MANIFEST_NAME, is_url, list_fingerprint_dirs, read_manifest
from tokweight.store.parts import read_part, sha256_path


JOIN_COLUMNS = ("key", "T", "b", "target_id")
"""What ``rows_for_shard`` reads of a part: a third of its bytes, the rest is for SQL and inspection."""

ROWS_CACHE_PARTS = 32
"""Parts whose parsed rows a view keeps: a training stream that draws a shard again finds them."""


class BaselineStore:
    """A store root holding one ``fingerprint=<fp>/`` directory per checkpoint."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._shard_sha: dict[tuple, str] = {}  # shared by the views it opens: a data tar is hashed once

    def fingerprints(self) -> list[str]:
        """Fingerprints with a committed manifest, sorted."""
        return [d.name[len(FINGERPRINT_PREFIX):] for d in list_fingerprint_dirs(self.root)
                if (d / MANIFEST_NAME).is_file()]

    def open(self, fingerprint: str | None = None) -> "StoreView":
        available = self.fingerprints()
        if fingerprint is None:
            if len(available) != 1:
                raise ValueError(f"store {self.root} holds {len(available)} fingerprints {available}; "
                                 "pass the one to open")
            fingerprint = available[0]
        if fingerprint not in available:
            raise KeyError(f"store {self.root} has no committed fingerprint {fingerprint!r} "
                           f"(it has {available})")
        return StoreView(self.root, fingerprint, self._shard_sha)


class StoreView:
    """One fingerprint's committed manifest and the parts it lists."""

    def __init__(self, root: str | Path, fingerprint: str, shard_sha: dict[tuple, str] | None = None):
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.dir = self.root / f"{FINGERPRINT_PREFIX}{fingerprint}"
        manifest = read_manifest(self.dir)  # DamagedFile (a ValueError) if it does not verify
        if manifest is None:
            raise FileNotFoundError(f"{self.dir}: no {MANIFEST_NAME}")
        if manifest.get("fingerprint") != fingerprint:
            raise ValueError(f"{self.dir / MANIFEST_NAME}: fingerprint {manifest.get('fingerprint')!r} does not "
                             f"match its directory ({fingerprint!r})")
        self.manifest = manifest
        self._parts = {p["name"]: p for p in manifest["parts"]}
        # (path, size, mtime_ns) -> sha256: each tar hashed once (per store, when opened through one)
        self._shard_sha: dict[tuple, str] = {} if shard_sha is None else shard_sha
        self._rows: OrderedDict[str, dict] = OrderedDict()  # part name -> rows_for_shard's dict, least recent first
        self.bytes_read = 0  # part files read and data tars hashed, by this view

    def __repr__(self) -> str:
        return f"StoreView({str(self.root)!r}, {self.fingerprint!r})"

    @property
    def schema_version(self) -> int:
        """Of the parts on disk; ``read_part`` returns the current columns whatever it is."""
        return int(self.manifest["schema_version"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    def parts(self) -> list[dict]:
        return list(self.manifest["parts"])

    def part_path(self, name: str) -> Path:
        if name not in self._parts:
            raise KeyError(f"{name!r} is not listed in {self.dir / MANIFEST_NAME}")
        return self.dir / name

    def read_part(self, name: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The part as a PART_SCHEMA table (only ``columns``, if given), after checking the whole file's
        sha256 against the manifest."""
        path, entry = self.part_path(name), self._parts[name]
        if not path.exists():
            raise FileNotFoundError(f"part {name} of {self.dir} is missing; `tokweight extract` re-creates it")
        sha, _ = sha256_path(path)
        self.bytes_read += path.stat().st_size
        if sha != entry["sha256"]:
            raise ValueError(f"part {name} of {self.dir} is damaged (sha256 {sha[:12]}..., manifest says "
                             f"{entry['sha256'][:12]}...); `tokweight extract` re-creates it")
        return read_part(path, self.manifest["format"], columns, self.schema_version)

    def _shard_sha256(self, path: Path, size: int) -> str:
        stat = path.stat()
        cache_key = (str(path.resolve()), size, stat.st_mtime_ns)
        if cache_key not in self._shard_sha:
            self._shard_sha[cache_key] = sha256_path(path)[0]
            self.bytes_read += size
        return self._shard_sha[cache_key]

    def input_for_shard(self, shard_path: str | Path) -> dict:
        """The manifest's input entry whose (size, sha256) equals this tar's; for a URL, the entry read from it."""
        if is_url(shard_path):
            return self._input_for_url(shard_path)
        path = Path(shard_path)
        size = path.stat().st_size
        same_size = [e for e in self.manifest["inputs"] if e["size"] == size]
        if same_size:
            sha = self._shard_sha256(path, size)
            for entry in same_size:
                if entry["sha256"] == sha:
                    return entry
        raise KeyError(f"shard {path} ({size} bytes) matches no input of {self.dir}: it was not extracted "
                       "with this checkpoint, or it changed since")

    def _input_for_url(self, url: str) -> dict:
        for entry in self.manifest["inputs"]:
            if entry.get("url") == url:
                return entry
        raise KeyError(f"shard {url} matches no input of {self.dir}: it was not extracted with this checkpoint "
                       "from this URL")

    def _part_for_shard(self, shard_path) -> str:
        entry = self.input_for_shard(shard_path)
        if entry.get("part") is None:
            raise KeyError(f"shard {shard_path} was skipped at extraction ({entry.get('skipped')}); "
                           f"{self.dir} has no rows for it")
        return entry["part"]

    def skipped_whole(self, shard_path) -> str | None:
        """Why extraction skipped this tar whole ("truncated-shard"); None if it has a part or is no input."""
        try:
            entry = self.input_for_shard(shard_path)
        except KeyError:
            return None
        return entry.get("skipped") if entry.get("part") is None else None

    def skipped_keys(self, shard_path) -> dict[str, str]:
        """key -> reason, for the samples of this tar that extraction left out of its part (the part
        entry's ``skipped_keys``; empty for a store written before they were recorded)."""
        part = self._parts[self._part_for_shard(shard_path)]
        return {key: reason for reason, keys in part.get("skipped_keys", {}).items() for key in keys}

    def has_rows_for(self, shard_path) -> bool:
        """Whether this tar was extracted into a part (not absent, changed or skipped)."""
        try:
            self._part_for_shard(shard_path)
        except KeyError:
            return False
        return True

    def rows_for_shard(self, shard_path) -> dict[str, dict]:
        """key -> {"T": int, "b": (T,) float32 nats, "target_id": (T,) int32} for one input shard.

        The last ``ROWS_CACHE_PARTS`` parts stay parsed: read, checksummed and parsed once each."""
        name = self._part_for_shard(shard_path)
        if name in self._rows:
            self._rows.move_to_end(name)
            return self._rows[name]
        rows = self._parse_rows(name)
        self._rows[name] = rows
        if len(self._rows) > ROWS_CACHE_PARTS:
            self._rows.popitem(last=False)
        return rows

    def _parse_rows(self, name: str) -> dict[str, dict]:
        table = self.read_part(name, JOIN_COLUMNS)
        T = table.column("T").to_numpy()
        bounds = np.cumsum(T)[:-1]
        b = np.split(table.column("b").combine_chunks().flatten().to_numpy(), bounds)
        ids = np.split(table.column("target_id").combine_chunks().flatten().to_numpy(), bounds)
        return {key: {"T": int(t), "b": bi, "target_id": ii}
                for key, t, bi, ii in zip(table.column("key").to_pylist(), T, b, ids)}

    def mean_example_mean_b(self, shard_paths=None) -> float:
        """Mean over examples of mean_t b_t, for those shards' parts (all parts if None)."""
        if shard_paths is None:
            entries = self.parts()
        else:
            entries = [self._parts[self._part_for_shard(p)] for p in shard_paths]
        rows = sum(e["rows"] for e in entries)
        if not rows:
            raise ValueError(f"{self.dir}: no rows in the selected parts")
        return math.fsum(e["sum_example_mean_b"] for e in entries) / rows

    def vocab_tokens(self) -> list[str]:
        return list(self.manifest["vocab"]["tokens"])
