"""The columns of a baseline-store part, whatever its on-disk format (SPEC §4).

One row per example. Per-token lists are indexed by position in S (0..T-1), float32
in nats. `cumsum_b` and the per-example scalars after `b_sum` are functions of `b` alone
(store/derived.py defines them): `cumsum_b` makes the cumulative-share t0 estimator a list
query instead of a window function, and `b_sq_sum`, `b_xlogx_sum`, `b_max` make the
weight-concentration diagnostics scalar expressions instead of per-token arithmetic.

Version 2 added `b_sq_sum`, `b_xlogx_sum` and `b_max`; a store of another version is
refused by the readers and by `extract` (re-extract it into a fresh store).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 2

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
    pa.field("strategy", pa.string(), nullable=True),         # passed through from the sample
    pa.field("t0", pa.int32(), nullable=True),                # passed through from the sample
])

TOKEN_LIST_COLUMNS = ("b", "target_id", "entropy", "top1", "cumsum_b")
