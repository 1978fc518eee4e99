"""Length bucketing: group sequences of similar length so that a batch wastes few padded tokens.

A batch costs ``len(batch) * max_length`` computed tokens. Sorting by length and cutting
the sorted run whenever the next sequence would push the batch past ``batch_tokens``
keeps lengths inside a batch nearly equal, so padding stays a small share of the
computed tokens (``padded_fraction``) and the batch size adapts to the length.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence, TypeVar

Item = TypeVar("Item")


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices into ``lengths`` grouped into batches with ``len(batch) * max length <= batch_tokens``.

    Batches come shortest first; inside a batch indices are in length order (ties by
    index), so the plan is deterministic. A sequence longer than ``batch_tokens`` gets
    a batch of its own.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if current and (len(current) + 1) * lengths[i] > batch_tokens:  # lengths[i] is the new max
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padded_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Padded tokens / computed tokens of a plan (0 when nothing is computed)."""
    computed = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    real = sum(lengths[i] for b in batches for i in b)
    return (computed - real) / computed if computed else 0.0


def bucket(items: Sequence[Item], batch_tokens: int, length: Callable[[Item], int]) -> Iterator[list[Item]]:
    """Stage: a finite run of items -> batches of them, planned by ``plan_batches``."""
    for batch in plan_batches([length(item) for item in items], batch_tokens):
        yield [items[i] for i in batch]
