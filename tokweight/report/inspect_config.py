"""`tokweight inspect`'s configuration.

Imports only the standard library and config modules, so that the CLI builds its options from these fields
without importing duckdb, numpy or pyarrow."""

from __future__ import annotations

from dataclasses import dataclass

from tokweight.store.sql_config import STORED_EPS, STORED_Q, STORED_TAU, EstimatorParams


@dataclass(frozen=True)
class InspectConfig:
    """What `tokweight inspect` reads and where it writes."""

    store: str
    """Store root (holding fingerprint=<fp>/ directories)."""
    out: str
    """Report directory; created if missing, its report files overwritten."""
    data: str | None = None
    """Dataset the store was extracted from: its strategy/t0 fill in what stored rows lack."""
    fingerprints: tuple[str, ...] = ()
    """Fingerprints to report side by side; empty: all in the store."""
    q: float = STORED_Q
    """Cumulative share for t0_share."""
    tau: float = STORED_TAU
    """Threshold in nats for t0_threshold."""
    eps: float = STORED_EPS
    """Degenerate-example threshold on sum b."""
    exact_quantiles: bool = False
    """The per-position profile's quantiles over every example (default: a key-hash sample of examples
    above store.sql.QUANTILE_TOKENS tokens; the profile's n_quantile column says how many were read)."""

    def __post_init__(self):
        object.__setattr__(self, "fingerprints", tuple(self.fingerprints))
        EstimatorParams(self.q, self.tau, self.eps)  # validates
        if not self.store:
            raise ValueError("store must be a path")

    @property
    def params(self) -> EstimatorParams:
        return EstimatorParams(self.q, self.tau, self.eps)
