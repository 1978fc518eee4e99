"""Benchmark: the t0 and weight diagnostics in SQL against a plain scan of the same files (SPEC §6).

Builds a store of synthetic random surprisals (no model: rows written through the store's
own writer, store.writer.StoreWriter, Parquet, one part per "shard"), opens it with store.sql,
and times in one run (best of --repeat rounds, each round running every query once):

- scan (unnest):   SELECT sum(b) FROM (SELECT unnest(b) AS b FROM store_rows)
- scan (list_sum): SELECT sum(list_sum(b)) FROM store_rows
- t0 + weight diagnostics: every per-example estimator of the `examples` view
  (t0_share, t0_threshold, dilution, amplification, entropy, effective tokens, max
  share, degenerate) aggregated per fingerprint, so all of them are computed
- the headline summary (store/sql/summary.sql)
- per-position profile (store/sql/profile_by_position.sql, exact quantiles)

and prints each time and its ratio to both scans. Target: diagnostics <= 3x the scan.

    python scripts/bench_sql.py --tokens 10_000_000 --out /tmp/bench_sql_store
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from store.derived import DERIVED_SCALARS, derived_columns
from store.formats import PARQUET
from store.manifest import InputEntry, Provenance
from store.schema import PART_SCHEMA
from store.sql import connect, read_sql
from store.writer import StoreWriter

FP = "b" * 32
VOCAB_SIZE = 64

QUERIES = {
    "scan: sum(unnest(b))": "SELECT sum(b) FROM (SELECT unnest(b) AS b FROM store_rows)",
    "scan: sum(list_sum(b))": "SELECT sum(list_sum(b)) FROM store_rows",
    "t0 + weight diagnostics": """
        SELECT fingerprint, count(*) FILTER (degenerate), avg(t0_share), avg(t0_threshold), avg(dilution),
               avg(amplification), avg(share_entropy), avg(effective_tokens), avg(max_share)
        FROM examples GROUP BY fingerprint""",
    "t0_share only": "SELECT avg(t0_share) FROM examples",
    "summary.sql": read_sql("summary"),
    "profile_by_position.sql": read_sql("profile_by_position"),
}


def synthetic_part(rng: np.random.Generator, shard: str, first: int, rows: int, t_range: tuple[int, int]) -> pa.Table:
    """Rows whose surprisal is high up to a random t0 and small after it, as in the real data."""
    T = rng.integers(*t_range, size=rows).astype(np.int32)
    t0 = (rng.random(rows) * np.minimum(T, 6)).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(T)]).astype(np.int32)
    pos = np.arange(offsets[-1]) - np.repeat(offsets[:-1], T)
    informative = pos <= np.repeat(t0, T)
    b = np.where(informative, rng.exponential(1.0, offsets[-1]), rng.exponential(0.01, offsets[-1])).astype(np.float32)
    derived = derived_columns(b, T)

    def lists(values, dtype):
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, dtype))

    return pa.Table.from_arrays([
        pa.array([f"k{first + i:09d}" for i in range(rows)]), pa.array([shard] * rows), pa.array(T),
        lists(b, pa.float32()), lists(rng.integers(0, VOCAB_SIZE, offsets[-1]).astype(np.int32), pa.int32()),
        lists(rng.random(offsets[-1]).astype(np.float32), pa.float32()),
        lists(rng.random(offsets[-1]) < 0.5, pa.bool_()), lists(derived["cumsum_b"], pa.float32()),
        *(pa.array(derived[name]) for name in DERIVED_SCALARS),
        pa.array(rng.choice(["copy", "reverse", "sort", "sort-desc"], rows)), pa.array(t0),
    ], schema=PART_SCHEMA)


def build_store(out: Path, tokens: int, parts: int, t_range: tuple[int, int], seed: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    writer = StoreWriter(out, FP, PARQUET)
    writer.directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rows_per_part = math.ceil(1.02 * tokens / parts / ((t_range[0] + t_range[1] - 1) / 2))  # at least `tokens`
    records = []
    for i in range(parts):
        shard = f"train/shard-{i:06d}.tar"
        table = synthetic_part(rng, shard, i * rows_per_part, rows_per_part, t_range)
        source = InputEntry(shard, 0, "0" * 64, samples=len(table), part=writer.part_name(i))
        records.append(writer.write_part(table, source))
    provenance = Provenance(template_version="bench", checkpoint_path="none", model_config={},
                            vocab=tuple(f"t{i}" for i in range(VOCAB_SIZE)), data_root="none")
    return writer.commit(records, provenance).stats()


def best_times(con, queries: dict[str, str], repeat: int) -> dict[str, float]:
    """Best wall time of each query; rounds run every query once, so load spikes hit all alike."""
    best = {name: math.inf for name in queries}
    for _ in range(repeat):
        for name, query in queries.items():
            t = time.perf_counter()
            con.sql(query).fetchall()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--parts", type=int, default=20)
    ap.add_argument("--min-T", type=int, default=16)
    ap.add_argument("--max-T", type=int, default=96, help="exclusive")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/bench_sql_store")
    ap.add_argument("--reuse", action="store_true", help="keep an existing store at --out")
    args = ap.parse_args()

    out = Path(args.out)
    t = time.perf_counter()
    if args.reuse and (out / f"fingerprint={FP}" / "manifest.json").is_file():
        print("reusing", out)
    else:
        print("store:", build_store(out, args.tokens, args.parts, (args.min_T, args.max_T), args.seed),
              f"written in {time.perf_counter() - t:.1f} s")
    size = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    con = connect(out)
    con.execute(f"SET threads = {args.threads}")
    rows, tokens = con.sql("SELECT count(*), sum(T) FROM store_rows").fetchall()[0]
    print(f"{rows} examples, {tokens} tokens, {size / 1e6:.1f} MB of Parquet ({size / tokens:.2f} B/token), "
          f"DuckDB threads={args.threads}, best of {args.repeat}")
    times = best_times(con, QUERIES, args.repeat)
    unnest, list_sum = times["scan: sum(unnest(b))"], times["scan: sum(list_sum(b))"]
    print(f"{'query':<28}{'seconds':>9}{'/ unnest scan':>15}{'/ list_sum scan':>17}")
    for name, seconds in times.items():
        print(f"{name:<28}{seconds:>9.3f}{seconds / unnest:>15.2f}{seconds / list_sum:>17.2f}")


if __name__ == "__main__":
    main()
