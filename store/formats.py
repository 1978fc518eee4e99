"""The part formats a store can hold, named once.

A format's name is the manifest's ``"format"``, a choice of ``tokweight extract --format``
and, after a dot, its parts' suffix (``part-NNNNN.parquet``, ``part-NNNNN.zarr/``).
``store.parts`` holds each format's reader and writer; this module imports nothing, so
that the CLI can list the choices without paying for pyarrow at start-up.
"""

from __future__ import annotations

PARQUET, ZARR = "parquet", "zarr"
PART_FORMATS = (PARQUET, ZARR)


def check_format(fmt: str) -> str:
    if fmt not in PART_FORMATS:
        raise ValueError(f"unknown part format {fmt!r}; expected one of {sorted(PART_FORMATS)}")
    return fmt


def part_suffix(fmt: str) -> str:
    return "." + check_format(fmt)
