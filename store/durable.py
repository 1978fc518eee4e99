"""Durable files: bytes fsynced before they are renamed into place, the directory fsynced after.

A crash leaves either the old file or the new one, never half of one: a file is written under
``<name>.tmp`` (TMP_SUFFIX), fsynced, renamed, and its directory fsynced so the rename itself
survives. The store's parts and manifests are written this way, and so is every JSON file that
a later run reads back (dataset.json, the experiments' cell records).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokweight.store import faults

TMP_SUFFIX = ".tmp"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durable(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (not atomic by itself: callers rename).

    In two halves, with the test-only fault hook between them (store.faults): a failing
    write leaves a torn file, as a full disk would."""
    data, half = memoryview(data), len(data) // 2
    with open(path, "wb") as f:
        f.write(data[:half])
        faults.on_write(path)
        f.write(data[half:])
        f.flush()
        os.fsync(f.fileno())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``<path>.tmp``, fsync, rename to ``path``, fsync the directory."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    write_bytes_durable(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def canonical_bytes(obj: dict) -> bytes:
    """Sorted keys, indent 1, a final newline; NaN and inf refused (ValueError)."""
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def write_json_atomic(path: Path, obj: dict) -> None:
    """Canonical JSON (NaN and inf refused before anything is written), written atomically and durably."""
    write_bytes_atomic(path, canonical_bytes(obj))
