"""SQL over a baseline store: an in-process DuckDB connection with documented views.

Views (``describe(con)`` prints their columns):

- ``store_rows``: one row per stored example, the columns of ``store.schema.PART_SCHEMA``
  plus ``fingerprint`` (text), read from the parts that the manifests list and nothing else;
- ``examples``: every stored column plus the per-example estimators (``store/sql/*.sql``);
- ``tokens``: one row per supervised token (position in S, b, token id and symbol, ...); a
  query reads only the per-token lists it names;
- ``vocab``: (fingerprint, id, token);
- ``manifests``: one row per fingerprint with the manifest's counts and the full JSON;
- ``posteriors`` (with ``add_posteriors``, `tokweight sql --run RUN`): a train run's per-example
  posteriors, the ``posteriors-<split>.parquet`` files `tokweight encode` writes into the run
  (training/decoding/encode.py says their columns); they join the other views on key (and fingerprint).

Several fingerprints (checkpoints) of one store sit side by side, told apart by the
``fingerprint`` column. Parquet parts are read by DuckDB from an explicit file list, so a
stray or half-written file beside them is never seen; other formats (Zarr), and stores of
an older schema version (whose missing columns store.parts.read_part computes, said once on
stderr), are read by ``StoreView.read_part`` into Arrow tables that DuckDB scans in place.

Parts store t0_share and t0_threshold at the default parameters (store.sql_config.STORED_Q,
STORED_TAU, STORED_EPS): at those, the `examples` view reads the stored values and no list;
at others (``EstimatorParams``, or ``SET VARIABLE q = ...``) it computes them from the lists.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from importlib import resources
from pathlib import Path

import duckdb
import pyarrow as pa

from tokweight.store.baseline_store import BaselineStore, StoreView
from tokweight.store.formats import PARQUET
from tokweight.store.schema import PART_SCHEMA, SCHEMA_VERSION, added_after
from tokweight.store.sql_config import STORED_EPS, STORED_Q, STORED_TAU, EstimatorParams

EXAMPLE_QUERIES = (
    ("SELECT fingerprint, count(*) AS examples, avg((t0_share = t0)::INT) AS t0_exact, avg(amplification) AS amp\n"
    "FROM examples GROUP BY fingerprint"),
    "SELECT pos, avg(b) AS mean_b, quantile_cont(b, 0.9) AS q90_b FROM tokens GROUP BY pos ORDER BY pos",
    ("SELECT strategy, avg(effective_tokens / T) AS eff_frac, count(*) FILTER (degenerate) AS degenerate\n"
    "FROM examples GROUP BY strategy ORDER BY strategy"),
)
VIEWS = ("examples", "tokens", "vocab", "manifests", "store_rows")
QUANTILE_TOKENS = 2**20
"""Above this many tokens profile_by_position's quantiles come from a sample of examples
(views.sql): exact quantiles cost several scans of b, a sample of this size less than one
(docs/benchmarks.md, SQL)."""
POSTERIORS_FILE = "posteriors-{split}.parquet"
"""`tokweight encode`'s file in a run directory, which ``add_posteriors`` reads."""
_ROWS_SCHEMA = pa.schema([pa.field("fingerprint", pa.string(), nullable=False), *PART_SCHEMA])


def read_sql(name: str) -> str:
    """The text of ``store/sql/<name>.sql`` (package data)."""
    return (resources.files("tokweight.store") / "sql" / f"{name}.sql").read_text()


def connect(store: str | Path, fingerprints: list[str] | tuple[str, ...] | None = None,
            params: EstimatorParams = EstimatorParams(), ground_truth: pa.Table | None = None,
            quantile_tokens: int | None = QUANTILE_TOKENS,
            shards: Collection[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the views over ``fingerprints`` (all if None).

    ground_truth: optional (fingerprint, shard, key, strategy, t0) rows that fill in the
    passed-through `strategy` and `t0` where a stored row has none (``pipeline.data.labels.ground_truth_from_data``).
    quantile_tokens: profile_by_position's quantiles are exact up to this many tokens in
    the store, and above it taken over a hash sample of examples holding about this many
    tokens (views.sql: the sample and its error); None: always exact.
    shards: input shard names whose parts the views read (all if None): a store may also hold what
    a checkpoint scored of other data.
    """
    base = BaselineStore(store)
    fingerprints = list(fingerprints) if fingerprints else base.fingerprints()
    if not fingerprints:
        raise ValueError(f"store {store} holds no fingerprint with a manifest")
    views = [base.open(fp) for fp in fingerprints]  # checks each manifest's schema version
    con = duckdb.connect()
    for name, value in (("q", params.q), ("tau", params.tau), ("eps", params.eps), ("stored_q", STORED_Q),
                        ("stored_tau", STORED_TAU), ("stored_eps", STORED_EPS)):
        con.execute(f"SET VARIABLE {name} = {float(value)!r}::DOUBLE")
    con.execute(f"SET VARIABLE quantile_tokens = {'NULL' if quantile_tokens is None else int(quantile_tokens)}::DOUBLE")
    sources = [_rows_source(con, view, i, shards) for i, view in enumerate(views)]
    rows = "\nUNION ALL BY NAME\n".join(sources)
    if ground_truth is not None:
        con.register("ground_truth", ground_truth)
        rows = (f"SELECT r.* REPLACE (coalesce(r.strategy, g.strategy) AS strategy, "
                f"coalesce(r.t0, g.t0::INTEGER) AS t0)\nFROM ({rows}) AS r\nLEFT JOIN ground_truth AS g "
                "ON g.fingerprint = r.fingerprint AND g.shard = r.shard AND g.key = r.key")
    con.execute(f"CREATE VIEW store_rows AS {rows}")
    con.register("vocab", _vocab_table(views))
    con.register("manifests", _manifest_table(views))
    con.execute(read_sql("estimators"))
    con.execute(read_sql("weightings"))
    con.execute(read_sql("views"))
    return con


def add_posteriors(con: duckdb.DuckDBPyConnection, run: str | Path, one_strategy: float = 0.9) -> None:
    """The view ``posteriors`` over every ``RUN/posteriors-<split>.parquet`` (a ``split`` column tells them apart),
    and ``latent_values``: per split and latent value, its examples, the shares of their strategy labels and its
    status: "one strategy" when the most common label takes >= ``one_strategy`` of its labelled examples, "merge"
    when a second takes >= 1 - ``one_strategy``, else "unreliable"; "no labels" without any."""
    files = sorted(Path(run).glob(POSTERIORS_FILE.format(split="*")))
    if not files:
        raise ValueError(f"run {run} holds no {POSTERIORS_FILE.format(split='<split>')}: write one with "
                         f"`tokweight encode --run {run} --data DATA --split SPLIT`")
    file_list = ", ".join(_sql_string(str(f)) for f in files)
    con.execute(f"CREATE VIEW posteriors AS SELECT * FROM read_parquet([{file_list}], union_by_name = true)")
    con.execute(read_sql("latent_values").replace("$one_strategy", repr(float(one_strategy))))


def _rows_source(con: duckdb.DuckDBPyConnection, view: StoreView, i: int, shards: Collection[str] | None) -> str:
    """A SELECT over one fingerprint's manifest-listed parts (of ``shards`` only, if given), with the
    fingerprint as text."""
    fp = _sql_string(view.fingerprint)
    parts = [part for part in view.parts() if shards is None or part["input"] in shards]
    if view.schema_version != SCHEMA_VERSION:
        _note_computed_columns(view)
    elif view.manifest.get("format") == PARQUET and parts:
        files = [str(_checked_part_path(view, part)) for part in parts]
        file_list = ", ".join(_sql_string(f) for f in files)
        return f"SELECT {fp}::VARCHAR AS fingerprint, * FROM read_parquet([{file_list}], hive_partitioning = false)"
    # Zarr, an older schema version, or no part yet: materialise through the store's reader, which verifies
    # checksums and computes the columns an older version lacks.
    tables = [view.read_part(part["name"]).select(PART_SCHEMA.names) for part in parts]
    rows = pa.concat_tables(tables) if tables else PART_SCHEMA.empty_table()
    rows = rows.add_column(0, "fingerprint", pa.array([view.fingerprint] * rows.num_rows, pa.string()))
    name = f"rows_{i}"
    con.register(name, rows.cast(_ROWS_SCHEMA))
    return f"SELECT * FROM {name}"


_NOTED: set[Path] = set()  # fingerprint directories of an older schema version, said once per process


def _note_computed_columns(view: StoreView) -> None:
    """Say once on stderr that a store of an older schema version has its missing columns computed."""
    if view.dir in _NOTED:
        return
    _NOTED.add(view.dir)
    print(f"note: {view.dir} has store schema version {view.schema_version}: its "
          f"{', '.join(added_after(view.schema_version))} are computed on the fly at every connection "
          f"(slower); a store extracted anew has them stored (version {SCHEMA_VERSION})", file=sys.stderr)


def _checked_part_path(view: StoreView, part: dict) -> Path:
    """The part's file, refused if missing or not the size the manifest recorded.

    A cheap guard against a torn or replaced file; the full sha256 check is
    ``tokweight store verify``.
    """
    path = view.part_path(part["name"])
    if not path.is_file():
        raise ValueError(f"store {view.root}: part {part['name']} of fingerprint {view.fingerprint} is listed "
                         f"in the manifest but missing at {path}")
    if "bytes" in part and path.stat().st_size != part["bytes"]:
        raise ValueError(f"store {view.root}: part {path} has {path.stat().st_size} bytes, the manifest says "
                         f"{part['bytes']}; run `tokweight store verify`")
    return path


def _sql_string(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _vocab_table(views: list[StoreView]) -> pa.Table:
    fps, ids, tokens = [], [], []
    for view in views:
        toks = view.vocab_tokens()
        fps += [view.fingerprint] * len(toks)
        ids += range(len(toks))
        tokens += toks
    return pa.table({"fingerprint": pa.array(fps, pa.string()), "id": pa.array(ids, pa.int32()),
                     "token": pa.array(tokens, pa.string())})


def _manifest_table(views: list[StoreView]) -> pa.Table:
    records = []
    for view in views:
        m, stats = view.manifest, view.manifest.get("stats", {})
        records.append({
            "fingerprint": view.fingerprint, "format": m.get("format"), "complete": bool(m.get("complete")),
            "tool_version": m.get("tool_version"), "schema_version": m.get("schema_version"),
            "template_version": m.get("template_version"), "checkpoint_path": m.get("checkpoint", {}).get("path"),
            "data_root": m.get("data_root"), "inputs": len(m.get("inputs", [])), "parts": len(m.get("parts", [])),
            "rows": stats.get("rows"), "tokens": stats.get("tokens"), "b_sum": stats.get("b_sum"),
            "mean_example_mean_b": stats.get("mean_example_mean_b"),
            "skipped": json.dumps(m.get("skipped", {}), sort_keys=True), "manifest": json.dumps(m, sort_keys=True),
        })
    schema = pa.schema([("fingerprint", pa.string()), ("format", pa.string()), ("complete", pa.bool_()),
                        ("tool_version", pa.string()), ("schema_version", pa.int64()),
                        ("template_version", pa.string()), ("checkpoint_path", pa.string()),
                        ("data_root", pa.string()), ("inputs", pa.int64()), ("parts", pa.int64()),
                        ("rows", pa.int64()), ("tokens", pa.int64()), ("b_sum", pa.float64()),
                        ("mean_example_mean_b", pa.float64()), ("skipped", pa.string()), ("manifest", pa.string())])
    return pa.Table.from_pylist(records, schema=schema)


def describe(con: duckdb.DuckDBPyConnection) -> str:
    """The documented views' columns and types, then the example queries."""
    lines = []
    has_posteriors = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'posteriors'").fetchone()[0]
    for view in VIEWS + (("posteriors", "latent_values") if has_posteriors else ()):
        lines.append(f"{view}:")
        for name, dtype, *_ in con.execute(f"DESCRIBE {view}").fetchall():
            lines.append(f"  {name:<22} {dtype}")
    variables = con.execute("SELECT getvariable('q'), getvariable('tau'), getvariable('eps'), "
                            "getvariable('quantile_share')").fetchall()[0]
    lines.append("variables: q={}, tau={}, eps={}  (SET VARIABLE q = 0.8; to change one)".format(*variables[:3]))
    lines.append(f"profile_by_position's quantiles read a share {variables[3]:.3g} of the examples "
                 "(tokens.in_quantile_sample; 1: exact, --exact-quantiles)")
    lines.append("estimator macros (store/sql/estimators.sql): is_degenerate, t0_share, t0_threshold, dilution, "
                 "amplification, share_entropy, effective_tokens, max_share; symbol_of(fingerprint, token_id) "
                 "(views.sql); z_gain_uniform, z_gain_sum, z_gain_surprisal_share (weightings.sql)")
    lines.append("example queries:")
    lines += [f"  {q.replace(chr(10), chr(10) + '  ')};" for q in EXAMPLE_QUERIES]
    return "\n".join(lines)
