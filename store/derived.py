"""Columns of a store part that are functions of `b` alone, computed once at extraction.

They make the SQL diagnostics scalar or list queries instead of per-token arithmetic
(store/sql/estimators.sql gives the list form each one equals). Every value of a row
depends on that row's surprisals only, never on its neighbours in a part or a batch, so
parts do not change with batching, bucketing or the number of ranks.

- ``cumsum_b``     (T,) float32: running sum of b, accumulated in float64 left to right;
- ``b_sum``        float64: sum_t b_t;
- ``b_sq_sum``     float64: sum_t b_t^2 (effective tokens = b_sum^2 / b_sq_sum);
- ``b_xlogx_sum``  float64: sum_t b_t ln b_t with 0 ln 0 = 0
                   (entropy of pi = ln b_sum - b_xlogx_sum / b_sum);
- ``b_max``        float32: max_t b_t (max share = b_max / b_sum);
- ``t0_share``     int32: the SQL macro t0_share at STORED_Q and STORED_EPS, the first t with
                   float32 cumsum_b[t] >= q * b_sum (T - 1 if rounding leaves none), NULL if b_sum < eps;
- ``t0_threshold`` int32: the SQL macro t0_threshold at STORED_TAU, the last t with b_t > tau,
                   NULL if there is none.

The comparisons are those of the SQL macros, in float64 on the same stored float32
values, so a stored estimate equals the one the macro computes from the lists.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tokweight.store.sql_config import STORED_EPS, STORED_Q, STORED_TAU

NO_POSITION = -1  # a stored t0 estimate that is NULL, in the numpy arrays of ``derived_columns``

DERIVED_SCALARS = ("b_sum", "b_sq_sum", "b_xlogx_sum", "b_max", "t0_share", "t0_threshold")  # one value per example
_ARROW_TYPES = {"b_sum": pa.float64(), "b_sq_sum": pa.float64(), "b_xlogx_sum": pa.float64(), "b_max": pa.float32(),
                "t0_share": pa.int32(), "t0_threshold": pa.int32()}


def derived_columns(b: np.ndarray, T: np.ndarray) -> dict[str, np.ndarray]:
    """The derived columns of rows whose surprisals are concatenated in ``b``.

    b: (sum T,) float32 nats, row after row; T: (N,) row lengths, each >= 1.
    Returns ``cumsum_b`` flat like ``b`` and the per-row scalars, each (N,); the t0
    estimates hold NO_POSITION where they are NULL (``scalar_arrays`` makes them Arrow nulls).
    """
    b = np.asarray(b, dtype=np.float32)
    T = np.asarray(T, dtype=np.int64)
    if (T < 1).any():
        raise ValueError("every row needs T >= 1 (S always holds </y>)")
    if b.shape != (int(T.sum()),):
        raise ValueError(f"b has shape {b.shape}, the row lengths sum to {int(T.sum())}")
    if not len(T):
        empty64, empty32 = np.zeros(0, np.float64), np.zeros(0, np.int32)
        return {"cumsum_b": np.zeros(0, np.float32), "b_sum": empty64, "b_sq_sum": empty64,
                "b_xlogx_sum": empty64, "b_max": np.zeros(0, np.float32), "t0_share": empty32,
                "t0_threshold": empty32}
    starts = np.concatenate([[0], np.cumsum(T)[:-1]])  # (N,) first flat index of each row
    b64 = b.astype(np.float64)
    # Running sums row by row: a padded (N, T_max) matrix summed along its rows is the
    # same left-to-right accumulation as np.cumsum of each row on its own.
    inside = np.arange(T.max()) < T[:, None]  # (N, T_max) True on real positions
    padded = np.zeros(inside.shape, np.float64)
    padded[inside] = b64
    cumsum_b = np.cumsum(padded, axis=1)[inside].astype(np.float32)
    xlogx = b64 * np.log(np.where(b64 > 0, b64, 1.0))  # 0 where b = 0 (0 ln 0 = 0)
    b_sum = np.add.reduceat(b64, starts)  # each sum reads only its own row's slice
    return {
        "cumsum_b": cumsum_b,
        "b_sum": b_sum,
        "b_sq_sum": np.add.reduceat(b64 * b64, starts),
        "b_xlogx_sum": np.add.reduceat(xlogx, starts),
        "b_max": np.maximum.reduceat(b, starts),
        "t0_share": t0_share(cumsum_b, b_sum, T, STORED_Q, STORED_EPS),
        "t0_threshold": t0_threshold(b, T, STORED_TAU),
    }


def _positions(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((N,) first flat index of each row, (sum T,) position of each flat value in its row)."""
    starts = np.concatenate([[0], np.cumsum(T)[:-1]])
    return starts, np.arange(int(T.sum())) - np.repeat(starts, T)


def t0_share(cumsum_b: np.ndarray, b_sum: np.ndarray, T: np.ndarray, q: float, eps: float) -> np.ndarray:
    """(N,) int32: first t with cumsum_b[t] >= q * b_sum, else T - 1; NO_POSITION where b_sum < eps.

    cumsum_b: (sum T,) float32 as stored; b_sum: (N,) float64; T: (N,) >= 1."""
    starts, pos = _positions(T)
    reached = cumsum_b.astype(np.float64) >= q * np.repeat(b_sum, T)
    first = np.minimum.reduceat(np.where(reached, pos, np.repeat(T - 1, T)), starts)
    return np.where(b_sum < eps, NO_POSITION, first).astype(np.int32)


def t0_threshold(b: np.ndarray, T: np.ndarray, tau: float) -> np.ndarray:
    """(N,) int32: last t with b[t] > tau (compared in float64); NO_POSITION where there is none."""
    starts, pos = _positions(T)
    above = np.asarray(b, np.float32).astype(np.float64) > tau
    return np.maximum.reduceat(np.where(above, pos, NO_POSITION), starts).astype(np.int32)


def scalar_arrays(derived: dict[str, np.ndarray], names=DERIVED_SCALARS) -> dict[str, pa.Array]:
    """The per-example scalars of ``derived_columns`` as Arrow arrays of PART_SCHEMA's types,
    NO_POSITION as null."""
    return {name: pa.array(derived[name], type=_ARROW_TYPES[name],
                           mask=derived[name] == NO_POSITION if name.startswith("t0_") else None)
            for name in names}
