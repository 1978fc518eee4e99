"""The numbers of `tokweight inspect`, as plain data: every estimator of store/sql/ run once over a store.

``inspect_store`` returns the summary (summary.json: headline numbers per fingerprint, the collapse
threshold predicted per weighting), each profile and confusion query's full result, and the
per-example columns the plots read. Rendering them is the reporting layer's (``tokweight.report``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokweight.store.sql import QUANTILE_TOKENS, connect, read_sql
from tokweight.store.sql_config import EstimatorParams

PROFILE_QUERIES = ("profile_by_position", "profile_by_strategy", "profile_by_T")
TABLES = (*PROFILE_QUERIES, "t0_confusion")
PER_EXAMPLE = ("fingerprint", "T", "t0", "t0_share", "amplification", "amplification_true", "share_entropy",
               "effective_tokens", "max_share")


@dataclass(frozen=True)
class Inspection:
    summary: dict
    """store (resolved path), params, fingerprints (manifest and summary.sql's row, per fingerprint),
    predicted_beta_c (``predicted_beta_c``): JSON-safe."""
    tables: dict[str, pa.Table]
    """Each query of TABLES over every example: the full profiles and t0 confusion counts."""
    per_example: dict[str, np.ndarray]
    """The PER_EXAMPLE columns of the `examples` view, one entry per example (masked where NULL)."""


def inspect_store(store: str, fingerprints: tuple[str, ...] = (), params: EstimatorParams = EstimatorParams(),
                  ground_truth: pa.Table | None = None, exact_quantiles: bool = False) -> Inspection:
    """Run the inspection's queries over ``fingerprints`` of ``store`` (all if empty). ``ground_truth``:
    (fingerprint, shard, key, strategy, t0) rows that fill in what the stored rows lack."""
    con = connect(store, fingerprints, params, ground_truth=ground_truth,
                  quantile_tokens=None if exact_quantiles else QUANTILE_TOKENS)
    summary_rows = records(con.sql(read_sql("summary")).to_arrow_table())
    manifests = records(con.sql("SELECT * EXCLUDE (manifest) FROM manifests ORDER BY fingerprint").to_arrow_table())
    summary = {"store": str(Path(store).resolve()), "params": asdict(params),
               "fingerprints": [{**m_row, **s_row} for m_row, s_row in _pair(manifests, summary_rows)],
               "predicted_beta_c": predicted_beta_c(con)}
    tables = {name: con.sql(read_sql(name)).to_arrow_table() for name in TABLES}
    per_example = con.sql(f"SELECT {', '.join(PER_EXAMPLE)} FROM examples").fetchnumpy()
    return Inspection(summary, tables, per_example)


def predicted_beta_c(con) -> list[dict]:
    """Per fingerprint and weighting: the z-gain, its KL cost and beta_c = gain / cost
    (store/sql/predicted_beta_c.sql); cost and beta_c are None where no example carries a strategy label."""
    return records(con.sql(read_sql("predicted_beta_c")).to_arrow_table())


def records(table: pa.Table) -> list[dict]:
    """The rows as JSON-safe dicts: NaN and inf become None (JSON has neither)."""
    return [{k: _plain(v) for k, v in row.items()} for row in table.to_pylist()]


def _plain(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _pair(manifests: list[dict], summaries: list[dict]):
    by_fp = {s["fingerprint"]: s for s in summaries}
    for m in manifests:
        yield ({"fingerprint": m["fingerprint"], "format": m["format"], "complete": m["complete"],
                "skipped": json.loads(m["skipped"])}, by_fp.get(m["fingerprint"], {}))
