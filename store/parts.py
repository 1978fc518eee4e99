"""Store parts on disk: one Arrow table (``PART_SCHEMA``) per file (Parquet) or directory (Zarr).

Both formats (``store.formats.PART_FORMATS``) sit behind one interface
(``part_format(name).write/read``) and one publishing rule: a part is written under
``<name>.tmp``, fsynced, and renamed to its final name, so a reader (or a crash) never
sees half a part. ``write_part`` returns the sha256 and byte size of the finished part;
a Zarr directory's sha256 is taken over its files in sorted order (relative path, size,
bytes).

Parquet: one row per example with list columns, zstd, BYTE_STREAM_SPLIT on the float
lists (surprisals compress better split by byte: docs/benchmarks.md), dictionary encoding only
on the string columns, page checksums, one row group.
Zarr 3 (no ragged dtype): per list column a flat ``values`` array plus one shared
``offsets`` (N+1, int64); strings as ``dtype=str``; nullable columns get a ``<name>_valid``
bool array; one chunk per array, NaN fill for floats, zstd with its frame checksum.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokweight.store import faults
from tokweight.store.derived import derived_columns, scalar_arrays
from tokweight.store.durable import TMP_SUFFIX, fsync_dir, write_bytes_durable
from tokweight.store.formats import PARQUET, ZARR, check_format
from tokweight.store.schema import PART_SCHEMA, SCHEMA_VERSION, TOKEN_LIST_COLUMNS, added_after, version_schema

_FLOAT_LISTS = [f.name for f in PART_SCHEMA if pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type)]
_STRINGS = [f.name for f in PART_SCHEMA if pa.types.is_string(f.type)]


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def publish(tmp: Path, final: Path) -> None:
    """Rename a finished temporary file or directory to its final name, replacing any old one."""
    if final.is_dir():  # os.replace cannot replace a non-empty directory
        stale = final.with_name(final.name + ".old" + TMP_SUFFIX)
        remove_path(stale)
        os.replace(final, stale)
        os.replace(tmp, final)
        remove_path(stale)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


def sha256_path(path: str | Path) -> tuple[str, int]:
    """(sha256 hex, total bytes) of a file, or of a directory's files in sorted order."""
    path = Path(path)
    h, total = hashlib.sha256(), 0
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(f"{f.relative_to(path).as_posix()}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
                total += len(block)
    return h.hexdigest(), total


# ---------------------------------------------------------------- Parquet


class ParquetPart:
    def write(self, table: pa.Table, tmp: Path) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd", row_group_size=max(len(table), 1),
                       use_dictionary=_STRINGS,
                       use_byte_stream_split=[f"{c}.list.element" for c in _FLOAT_LISTS],
                       write_page_checksum=True)
        write_bytes_durable(tmp, sink.getvalue().to_pybytes())

    def read(self, path: Path, schema: pa.Schema, whole: bool) -> pa.Table:
        """whole: every column of the file, so that a stray one shows; else only ``schema``'s."""
        return pq.read_table(path, columns=None if whole else schema.names, page_checksum_verification=True)


# ---------------------------------------------------------------- Zarr


def _zarr_modules():
    import zarr  # imported on use: the Parquet path does not pay for it
    from zarr.codecs import ZstdCodec
    from zarr.storage import LocalStore

    return zarr, ZstdCodec, LocalStore


def _zarr_fill(dtype: np.dtype):
    return np.nan if dtype.kind == "f" else ("" if dtype.kind in "OT" else 0)


class ZarrPart:
    def write(self, table: pa.Table, tmp: Path) -> None:
        zarr, ZstdCodec, LocalStore = _zarr_modules()
        remove_path(tmp)
        group = zarr.open_group(store=LocalStore(tmp), mode="w", zarr_format=3,
                                attributes={"schema_version": SCHEMA_VERSION, "rows": len(table)})
        for name, data in self._columns(table).items():
            array = group.create_array(
                name, shape=data.shape, chunks=(max(len(data), 1),), dtype=str if data.dtype == object else data.dtype,
                fill_value=_zarr_fill(data.dtype), compressors=[ZstdCodec(level=3, checksum=True)],
                config={"write_empty_chunks": True})
            if len(data):
                array[...] = data
        for f in sorted(tmp.rglob("*"), reverse=True):  # files first, then their directories
            if f.is_file():
                faults.on_write(f)
                with open(f, "rb+") as stream:
                    os.fsync(stream.fileno())
            else:
                fsync_dir(f)
        fsync_dir(tmp)

    @staticmethod
    def _columns(table: pa.Table) -> dict[str, np.ndarray]:
        """Flat numpy arrays: ``offsets`` + one ``values`` array per list column, the rest as is."""
        lengths = table.column("T").to_numpy().astype(np.int64)
        out = {"offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)}
        for field in PART_SCHEMA:
            column = table.column(field.name).combine_chunks()
            if field.name in TOKEN_LIST_COLUMNS:
                out[field.name] = column.flatten().to_numpy(zero_copy_only=False)
            elif pa.types.is_string(field.type):
                out[field.name] = np.array([v if v is not None else "" for v in column.to_pylist()], dtype=object)
            else:
                out[field.name] = column.fill_null(0).to_numpy(zero_copy_only=False)
            if field.nullable:
                out[f"{field.name}_valid"] = column.is_valid().to_numpy(zero_copy_only=False)
        return out

    def read(self, path: Path, schema: pa.Schema, whole: bool) -> pa.Table:
        zarr, _, LocalStore = _zarr_modules()
        group = zarr.open_group(store=LocalStore(path, read_only=True), mode="r")
        offsets = pa.array(group["offsets"][...].astype(np.int32))
        columns = []
        for field in schema:
            values = group[field.name][...]
            if field.name in TOKEN_LIST_COLUMNS:
                array = pa.ListArray.from_arrays(offsets, pa.array(values, type=field.type.value_type))
            else:
                mask = ~group[f"{field.name}_valid"][...] if field.nullable else None
                array = pa.array(values.tolist() if pa.types.is_string(field.type) else values,
                                 type=field.type, mask=mask)
            columns.append(array)
        return pa.Table.from_arrays(columns, schema=schema)


PART_IO = {PARQUET: ParquetPart(), ZARR: ZarrPart()}  # the reader and writer of each of PART_FORMATS


def part_format(name: str) -> ParquetPart | ZarrPart:
    return PART_IO[check_format(name)]


def write_part(table: pa.Table, final: Path, fmt: str) -> dict:
    """Write ``table`` as the part ``final`` (temp name, fsync, rename); {"sha256", "bytes"} of the result."""
    if not table.schema.equals(PART_SCHEMA):
        raise ValueError(f"{final.name}: table schema differs from PART_SCHEMA:\n{table.schema}")
    tmp = final.with_name(final.name + TMP_SUFFIX)
    remove_path(tmp)
    part_format(fmt).write(table, tmp)
    sha, size = sha256_path(tmp)
    publish(tmp, final)
    return {"sha256": sha, "bytes": size}


def part_schema(columns: Sequence[str] | None = None) -> pa.Schema:
    """PART_SCHEMA, or its fields named in ``columns`` (in schema order); KeyError naming one it lacks."""
    if columns is None:
        return PART_SCHEMA
    unknown = set(columns) - set(PART_SCHEMA.names)
    if unknown:
        raise KeyError(f"no column {sorted(unknown)} in store schema version {SCHEMA_VERSION}")
    return pa.schema([field for field in PART_SCHEMA if field.name in columns])


def read_part(path: Path, fmt: str, columns: Sequence[str] | None = None, version: int = SCHEMA_VERSION) -> pa.Table:
    """A part written under schema ``version`` as a PART_SCHEMA table, or only its ``columns`` (a reader that
    needs few reads no others); ValueError naming the part if its columns are not those of ``version``.

    The columns that ``version`` lacks (store.schema.ADDED_IN) are computed from `b` as extraction
    computes them now (store.derived), so an older store reads like a current one."""
    want = part_schema(columns)
    stored = version_schema(version)
    computed = [name for name in want.names if name in added_after(version)]
    needed = set(want.names) | ({"T", "b"} if computed else set())
    schema = pa.schema([field for field in stored if field.name in needed])
    try:
        table = part_format(fmt).read(Path(path), schema, whole=columns is None)
    except KeyError as e:  # a Zarr part without one of the schema's arrays
        raise ValueError(f"{path}: no array {e} of store schema version {version}; re-extract it") from None
    if not table.schema.equals(schema, check_metadata=False):
        raise ValueError(f"{path}: its columns are not those of store schema version {version} "
                         f"(store/schema.py): {', '.join(table.schema.names)}; re-extract it")
    if computed:
        b = table.column("b").combine_chunks().flatten().to_numpy()
        derived = scalar_arrays(derived_columns(b, table.column("T").to_numpy()), computed)
        table = pa.Table.from_arrays([derived[n] if n in derived else table.column(n) for n in want.names],
                                     schema=want)
    return table
