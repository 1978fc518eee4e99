"""Columns of a store part that are functions of `b` alone, computed once at extraction.

They make the SQL diagnostics scalar or list queries instead of per-token arithmetic
(store/sql/estimators.sql gives the list form each one equals). Every value of a row
depends on that row's surprisals only, never on its neighbours in a part or a batch, so
parts do not change with batching, bucketing or the number of ranks.

- ``cumsum_b``    (T,) float32: running sum of b, accumulated in float64 left to right;
- ``b_sum``       float64: sum_t b_t;
- ``b_sq_sum``    float64: sum_t b_t^2 (effective tokens = b_sum^2 / b_sq_sum);
- ``b_xlogx_sum`` float64: sum_t b_t ln b_t with 0 ln 0 = 0
                  (entropy of pi = ln b_sum - b_xlogx_sum / b_sum);
- ``b_max``       float32: max_t b_t (max share = b_max / b_sum).
"""

from __future__ import annotations

import numpy as np

DERIVED_SCALARS = ("b_sum", "b_sq_sum", "b_xlogx_sum", "b_max")  # one value per example


def derived_columns(b: np.ndarray, T: np.ndarray) -> dict[str, np.ndarray]:
    """The derived columns of rows whose surprisals are concatenated in ``b``.

    b: (sum T,) float32 nats, row after row; T: (N,) row lengths, each >= 1.
    Returns ``cumsum_b`` flat like ``b`` and the per-row scalars, each (N,).
    """
    b = np.asarray(b, dtype=np.float32)
    T = np.asarray(T, dtype=np.int64)
    if (T < 1).any():
        raise ValueError("every row needs T >= 1 (S always holds </y>)")
    if b.shape != (int(T.sum()),):
        raise ValueError(f"b has shape {b.shape}, the row lengths sum to {int(T.sum())}")
    if not len(T):
        empty64 = np.zeros(0, np.float64)
        return {"cumsum_b": np.zeros(0, np.float32), "b_sum": empty64, "b_sq_sum": empty64,
                "b_xlogx_sum": empty64, "b_max": np.zeros(0, np.float32)}
    starts = np.concatenate([[0], np.cumsum(T)[:-1]])  # (N,) first flat index of each row
    b64 = b.astype(np.float64)
    # Running sums row by row: a padded (N, T_max) matrix summed along its rows is the
    # same left-to-right accumulation as np.cumsum of each row on its own.
    inside = np.arange(T.max()) < T[:, None]  # (N, T_max) True on real positions
    padded = np.zeros(inside.shape, np.float64)
    padded[inside] = b64
    xlogx = b64 * np.log(np.where(b64 > 0, b64, 1.0))  # 0 where b = 0 (0 ln 0 = 0)
    return {
        "cumsum_b": np.cumsum(padded, axis=1)[inside].astype(np.float32),
        "b_sum": np.add.reduceat(b64, starts),  # each sum reads only its own row's slice
        "b_sq_sum": np.add.reduceat(b64 * b64, starts),
        "b_xlogx_sum": np.add.reduceat(xlogx, starts),
        "b_max": np.maximum.reduceat(b, starts),
    }
