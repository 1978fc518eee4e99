"""The columns of a baseline-store part, whatever its on-disk format (docs/contract.md §4).

One row per example. Per-token lists are indexed by position in S (0..T-1), float32
in nats. `cumsum_b` and the per-example scalars after it are functions of `b` alone
(store/derived.py defines them): `cumsum_b` makes the cumulative-share t0 estimator a list
query instead of a window function, `b_sq_sum`, `b_xlogx_sum`, `b_max` make the
weight-concentration diagnostics scalar expressions instead of per-token arithmetic, and
`t0_share`, `t0_threshold` hold both t0 estimates at the default parameters
(store.derived.STORED_Q, STORED_TAU, STORED_EPS), so that the diagnostics read no list at all.

Version 2 added `b_sq_sum`, `b_xlogx_sum` and `b_max`; version 3 added `t0_share` and
`t0_threshold` (``ADDED_IN``). A store of an older version stays readable: the readers
compute the columns it lacks from `b` when its parts are read (store.parts.read_part);
`extract` writes only the current version (re-extract an older store into a fresh one).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 3

PART_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("shard", pa.string(), nullable=False),          # input shard, relative to the data root
    pa.field("T", pa.int32(), nullable=False),               # |S| = len(y) + 1
    pa.field("b", pa.list_(pa.float32()), nullable=False),   # (T,) surprisal -log p(y_t | x, y_<t), nats
    pa.field("target_id", pa.list_(pa.int32()), nullable=False),  # (T,) echoed token ids of S
    pa.field("entropy", pa.list_(pa.float32()), nullable=False),  # (T,) entropy of the base model's next-token distribution, nats
    pa.field("top1", pa.list_(pa.bool_()), nullable=False),      # (T,) the target is the base model's argmax
    pa.field("cumsum_b", pa.list_(pa.float32()), nullable=False),  # (T,) running sum of b
    pa.field("b_sum", pa.float64(), nullable=False),          # sum_t b_t
    pa.field("b_sq_sum", pa.float64(), nullable=False),       # sum_t b_t^2
    pa.field("b_xlogx_sum", pa.float64(), nullable=False),    # sum_t b_t ln b_t, 0 ln 0 = 0
    pa.field("b_max", pa.float32(), nullable=False),          # max_t b_t
    pa.field("t0_share", pa.int32(), nullable=True),          # first t with cumsum_b >= q sum b, at STORED_Q; NULL: degenerate
    pa.field("t0_threshold", pa.int32(), nullable=True),      # last t with b_t > tau, at STORED_TAU; NULL: none
    pa.field("strategy", pa.string(), nullable=True),         # passed through from the sample
    pa.field("t0", pa.int32(), nullable=True),                # passed through from the sample
])

TOKEN_LIST_COLUMNS = ("b", "target_id", "entropy", "top1", "cumsum_b")  # (T,) each

ADDED_IN = {2: ("b_sq_sum", "b_xlogx_sum", "b_max"), 3: ("t0_share", "t0_threshold")}
"""The columns each schema version added to the one before; all of them are functions of `b`."""

READABLE_VERSIONS = (1, 2, SCHEMA_VERSION)


def added_after(version: int) -> tuple[str, ...]:
    """Columns of PART_SCHEMA that a part of ``version`` lacks (the readers compute them from `b`)."""
    return tuple(name for v, names in sorted(ADDED_IN.items()) if v > version for name in names)


def version_schema(version: int) -> pa.Schema:
    """The columns that a part of ``version`` holds on disk, in PART_SCHEMA's order."""
    if version not in READABLE_VERSIONS:
        raise ValueError(f"store schema version {version!r} is not one of {READABLE_VERSIONS}")
    missing = set(added_after(version))
    return pa.schema([field for field in PART_SCHEMA if field.name not in missing])
