"""`tokweight sql`'s configuration and the estimators' parameters it shares with `tokweight inspect`.

Imports only the standard library, so that the CLI builds its options from these fields without importing duckdb,
numpy or pyarrow."""

from __future__ import annotations

import math
from dataclasses import dataclass

STORED_Q = 0.9
"""Cumulative share of the stored t0_share (``EstimatorParams``' default q)."""
STORED_TAU = 0.1
"""Nats, the threshold of the stored t0_threshold (the default tau)."""
STORED_EPS = 1e-6
"""Sum b below which the stored t0_share is NULL (the default eps)."""
SQL_FORMATS = ("table", "csv", "json", "parquet")
"""What `tokweight sql` writes a result as."""


@dataclass(frozen=True)
class EstimatorParams:
    """The estimators' parameters; they become the connection variables q, tau, eps."""

    q: float = STORED_Q
    """Cumulative share that t0_share waits for: the first t with cumsum_b[t] >= q * sum b."""
    tau: float = STORED_TAU
    """Surprisal threshold in nats: t0_threshold is the last t with b[t] > tau."""
    eps: float = STORED_EPS
    """An example with sum b < eps is degenerate: its shares pi_t are undefined."""

    def __post_init__(self):
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"q must be in (0, 1], got {self.q}")
        if not (math.isfinite(self.tau) and self.tau >= 0.0):
            raise ValueError(f"tau must be a finite number of nats >= 0, got {self.tau}")
        if not (math.isfinite(self.eps) and self.eps > 0.0):
            raise ValueError(f"eps must be finite and > 0, got {self.eps}")


@dataclass(frozen=True)
class SqlConfig:
    """What `tokweight sql` reads and how it writes the result."""

    store: str
    """Store root (holding fingerprint=<fp>/ directories)."""
    query: str | None = None
    """The SQL to run over the store's views; None: describe the views."""
    fingerprints: tuple[str, ...] = ()
    """Fingerprints to open; empty: every one in the store."""
    q: float = STORED_Q
    """Cumulative share for t0_share."""
    tau: float = STORED_TAU
    """Surprisal threshold (nats) for t0_threshold."""
    eps: float = STORED_EPS
    """Examples with sum b < eps are degenerate."""
    format: str = "table"
    """How the result is written: a table (shown), csv, json or parquet (which needs ``out``)."""
    out: str | None = None
    """Write the result here (parquet needs it); None: stdout."""
    max_rows: int = 40
    """Rows shown by the table format."""
    exact_quantiles: bool = False
    """Every example in tokens.in_quantile_sample, so profile_by_position's quantiles are exact whatever the
    store's size (slower above 2^20 tokens)."""
    run: str | None = None
    """A train run whose posteriors-<split>.parquet files (`tokweight encode`) become the view posteriors, joined
    with examples by key."""

    def __post_init__(self):
        object.__setattr__(self, "fingerprints", tuple(self.fingerprints))
        EstimatorParams(self.q, self.tau, self.eps)  # validates
        if self.format not in SQL_FORMATS:
            raise ValueError(f"format must be one of {SQL_FORMATS}, got {self.format!r}")
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")

    @property
    def params(self) -> EstimatorParams:
        return EstimatorParams(self.q, self.tau, self.eps)
