"""What ``tokweight convert`` reads: records of a JSON lines file, or rows of Parquet files, each with a number.

A source yields ``(index, raw)`` in file order, index 1-based and unique across the
source (a line number; a row's number counted over every file of a glob), and knows how
a raw item becomes a record (``decode``), what key a record without one gets
(``default_key``) and how errors and ``dataset.json`` name an index (``where``, ``entry``).
Both are read as streams, so memory does not grow with the file: JSON lines line by line,
Parquet row group by row group (``ParquetFile.iter_batches``), only the mapped columns.
"""

from __future__ import annotations

import glob
import json
from bisect import bisect_right
from pathlib import Path
from typing import Iterator

from tokweight.pipeline.data.config import SAMPLE_FIELDS
from tokweight.pipeline.data.errors import SampleError
from tokweight.store.parts import sha256_path

BATCH_ROWS = 4096  # Parquet rows decoded at once


def describe_file(path: Path) -> dict:
    sha256, size = sha256_path(path)
    return {"name": path.name, "size": size, "sha256": sha256}


class JsonLines:
    """A JSON lines file: each non-blank line an object with ``x``, ``y`` and the optional fields."""

    unit = "line"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.label = str(self.path)

    def records(self) -> Iterator[tuple[int, bytes]]:
        with open(self.path, "rb") as lines:  # split on b"\n" only, decode line by line
            yield from enumerate(lines, start=1)

    @staticmethod
    def blank(raw: bytes) -> bool:
        return not raw.strip()

    @staticmethod
    def decode(raw: bytes) -> dict:
        try:
            record = json.loads(raw.rstrip(b"\r\n").decode("utf-8"))  # so the error's "line 1" is this line
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SampleError("bad-json", f"json does not decode: {exc}") from None
        if not isinstance(record, dict):
            raise SampleError("wrong-type", f"line must hold a json object, got {type(record).__name__}")
        return record

    @staticmethod
    def default_key(index: int) -> str:
        return f"line-{index}"

    @staticmethod
    def where(index: int) -> str:
        return f"line {index}"

    @staticmethod
    def entry(index: int) -> dict:
        return {"line": index}

    def describe(self) -> dict:
        return describe_file(self.path)


class ParquetRows:
    """Rows of one Parquet file or a glob of them (in name order); ``columns`` maps sample fields to column
    names, and a field not mapped reads the column of its own name where there is one. A null is an absent
    field: a row without a key gets one from its place (``row-N``, ``<file>-row-N`` for several files)."""

    unit = "row"

    def __init__(self, pattern: str, columns: dict[str, str], split_field: str | None = None):
        import pyarrow.parquet as pq

        self.label = pattern
        self.paths = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not self.paths:
            raise FileNotFoundError(f"no Parquet file matches {pattern!r}")
        unknown = sorted(set(columns) - set(SAMPLE_FIELDS))
        if unknown:
            raise ValueError(f"--columns maps {', '.join(map(repr, unknown))}, which is no sample field: map "
                             f"{', '.join(SAMPLE_FIELDS)} (e.g. x=question,y=answer)")
        files = [pq.ParquetFile(p) for p in self.paths]
        self.fields = [self._fields(path, f.schema_arrow.names, columns, split_field)
                       for path, f in zip(self.paths, files)]
        self.starts = [0]  # global index - 1 of each file's first row
        for f in files:
            self.starts.append(self.starts[-1] + f.metadata.num_rows)

    @staticmethod
    def _fields(path: Path, names: list[str], columns: dict[str, str], split_field: str | None) -> dict[str, str]:
        """{record field: column} of one file; ValueError naming it where x, y or a mapped column is missing."""
        fields = {f: columns.get(f, f) for f in SAMPLE_FIELDS if columns.get(f, f) in names or f in columns}
        if split_field is not None:
            fields[split_field] = split_field
        missing = [f"{field} (column {column!r})" for field, column in fields.items() if column not in names]
        missing += [f"{field}" for field in ("x", "y") if field not in fields]
        if missing:
            raise ValueError(f"{path}: no column for {', '.join(missing)}; its columns are {', '.join(names)}: "
                             "map them with --columns x=COLUMN,y=COLUMN")
        return fields

    def records(self) -> Iterator[tuple[int, dict]]:
        import pyarrow.parquet as pq

        for path, fields, start in zip(self.paths, self.fields, self.starts):
            index = start
            batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=sorted(set(fields.values())))
            for batch in batches:  # one row group (or part of one) at a time
                for row in batch.to_pylist():
                    index += 1
                    yield index, {field: row[column] for field, column in fields.items() if row[column] is not None}

    @staticmethod
    def blank(raw: dict) -> bool:
        return False

    @staticmethod
    def decode(raw: dict) -> dict:
        return raw

    def _locate(self, index: int) -> tuple[Path, int]:
        """(file, 1-based row within it) of a global index."""
        i = bisect_right(self.starts, index - 1) - 1
        return self.paths[i], index - self.starts[i]

    def default_key(self, index: int) -> str:
        path, row = self._locate(index)
        return f"row-{row}" if len(self.paths) == 1 else f"{path.stem}-row-{row}"

    def where(self, index: int) -> str:
        path, row = self._locate(index)
        return f"row {row}" if len(self.paths) == 1 else f"{path.name} row {row}"

    def entry(self, index: int) -> dict:
        path, row = self._locate(index)
        return {"file": path.name, "row": row}

    def describe(self) -> dict:
        return {"parquet": [describe_file(p) for p in self.paths]}
