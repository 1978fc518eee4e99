"""Markdown tables and the cell formats they share: the `inspect` report, `eval.md`, the demo and the experiments.

A missing value prints as MISSING, never as 0 or an empty cell.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

MISSING = "–"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub Markdown table of already formatted cells (no trailing newline)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def records_table(records: list[dict], columns: dict[str, str]) -> str:
    """A table of ``records``: ``columns`` maps each record key to its header, in order; cells by ``general``."""
    return markdown_table(list(columns.values()), [[general(r.get(c)) for c in columns] for r in records])


def general(v) -> str:
    """A float to 4 significant digits, anything else as str; None: MISSING."""
    if v is None:
        return MISSING
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def fixed(v, digits: int = 3) -> str:
    """A number with ``digits`` decimals; None or non-finite: MISSING."""
    return MISSING if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def group_records(records: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """The records by their values of ``keys``, in order of first appearance."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups
