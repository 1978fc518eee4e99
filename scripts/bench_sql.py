"""Benchmark: the t0 and weight diagnostics and the profiles in SQL against a plain scan (docs/contract.md §6).

Builds a store of synthetic random surprisals (no model: rows written through the store's
own writer, store.writer.StoreWriter, Parquet, one part per "shard"), opens it with store.sql
twice (the default connection, and one with exact quantiles), and times in one run:

- scan (unnest):   SELECT sum(b) FROM (SELECT unnest(b) AS b FROM store_rows), the reference
- scan (list_sum): SELECT sum(list_sum(b)) FROM store_rows
- scan of b and cumsum_b: the two lists the t0 estimates read at parameters other than
  the stored ones (t0_threshold reads b, t0_share the running sum), unnested and summed
- t0 + weight diagnostics: every per-example estimator of the `examples` view
  (t0_share, t0_threshold, dilution, amplification, entropy, effective tokens, max
  share, degenerate) aggregated per fingerprint, so all of them are computed; at the
  default parameters they read only per-example scalars (store schema version 3)
- the headline summary (store/sql/summary.sql)
- per-position profile (store/sql/profile_by_position.sql): as connected by default
  (quantiles over a sample of about 2^20 tokens' examples above that size), and exact

The machine is shared and noisy, so every round runs each query once, in turn, and each
ratio is the median over rounds of (query / scan of the same round). Beside each ratio:
the 1-minute load average over that query's runs (min-max). Targets: diagnostics <= 2x,
per-position profile <= 4x. Then how far the sampled quantiles are from the exact ones.

    python scripts/bench_sql.py --tokens 10_000_000 --out /tmp/bench_sql_store
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from tokweight.store.derived import derived_columns, scalar_arrays
from tokweight.store.formats import PARQUET
from tokweight.store.manifest import InputEntry, Provenance
from tokweight.store.schema import PART_SCHEMA
from tokweight.store.sql import connect, read_sql
from tokweight.store.writer import StoreWriter

FP = "b" * 32
VOCAB_SIZE = 64

SCAN = "scan: sum(unnest(b))"
QUERIES = {  # name -> (connection: "default" or "exact", SQL)
    SCAN: ("default", "SELECT sum(b) FROM (SELECT unnest(b) AS b FROM store_rows)"),
    "scan: sum(list_sum(b))": ("default", "SELECT sum(list_sum(b)) FROM store_rows"),
    "scan: b and cumsum_b": ("default", "SELECT sum(b), sum(c) FROM (SELECT unnest(b) AS b, unnest(cumsum_b) AS c FROM store_rows)"),
    "t0 + weight diagnostics": ("default", """
        SELECT fingerprint, count(*) FILTER (degenerate), avg(t0_share), avg(t0_threshold), avg(dilution),
               avg(amplification), avg(share_entropy), avg(effective_tokens), avg(max_share)
        FROM examples GROUP BY fingerprint"""),
    "t0_share only": ("default", "SELECT avg(t0_share) FROM examples"),
    "summary.sql": ("default", read_sql("summary")),
    "profile_by_position.sql": ("default", read_sql("profile_by_position")),
    "profile_by_position, exact": ("exact", read_sql("profile_by_position")),
}
TARGETS = {"t0 + weight diagnostics": 2.0, "profile_by_position.sql": 4.0}


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

    return pa.Table.from_pydict({
        "key": pa.array([f"k{first + i:09d}" for i in range(rows)]), "shard": pa.array([shard] * rows),
        "T": pa.array(T), "b": lists(b, pa.float32()),
        "target_id": lists(rng.integers(0, VOCAB_SIZE, offsets[-1]).astype(np.int32), pa.int32()),
        "entropy": lists(rng.random(offsets[-1]).astype(np.float32), pa.float32()),
        "top1": lists(rng.random(offsets[-1]) < 0.5, pa.bool_()), "cumsum_b": lists(derived["cumsum_b"], pa.float32()),
        **scalar_arrays(derived),
        "strategy": pa.array(rng.choice(["copy", "reverse", "sort", "sort-desc"], rows)), "t0": pa.array(t0),
    }, schema=PART_SCHEMA)


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


def interleaved(connections: dict, repeat: int) -> dict[str, list[tuple[float, float]]]:
    """(seconds, 1-minute load average) of each query per round; a round runs every query once, in turn."""
    runs = {name: [] for name in QUERIES}
    for _ in range(repeat):
        for name, (connection, query) in QUERIES.items():
            t = time.perf_counter()
            connections[connection].sql(query).fetchall()
            runs[name].append((time.perf_counter() - t, os.getloadavg()[0]))
    return runs


def print_ratios(runs: dict[str, list[tuple[float, float]]]) -> None:
    scan = [seconds for seconds, _ in runs[SCAN]]
    print(f"{'query':<30}{'median s':>9}{'/ scan':>8}  {'load (1 min)':<13} target")
    for name, timings in runs.items():
        ratio = statistics.median(seconds / s0 for (seconds, _), s0 in zip(timings, scan))
        loads = [load for _, load in timings]
        target = f"<= {TARGETS[name]:g}x" if name in TARGETS else ""
        print(f"{name:<30}{statistics.median(s for s, _ in timings):>9.3f}{ratio:>8.2f}  "
              f"{min(loads):5.2f}-{max(loads):<5.2f}  {target}")


def print_quantile_error(connections: dict) -> None:
    """How far the default (sampled) per-position quantiles are from the exact ones on this store: as
    values, and as ranks among all of a position's values against the documented 2-sigma bound."""
    profile = read_sql("profile_by_position")
    sampled, exact = (connections[c].sql(profile).to_arrow_table().to_pylist() for c in ("default", "exact"))
    by_position = sorted_by_position(connections["default"])
    for column, p in (("q10_b", 0.1), ("median_b", 0.5), ("q90_b", 0.9)):
        errors = [abs(s[column] - e[column]) / e[column] for s, e in zip(sampled, exact) if e[column]]
        sigmas = [rank_offset(by_position[r["pos"]], r[column], p) / math.sqrt(p * (1 - p) / r["n_quantile"])
                  for r in sampled]
        print(f"{column}: sampled / exact - 1: median {statistics.median(errors):.4f}, max {max(errors):.4f}; "
              f"rank offset from {p}: median {statistics.median(sigmas):.2f}, max {max(sigmas):.2f} sigma, "
              f"{sum(x <= 2 for x in sigmas)}/{len(sigmas)} positions within 2 sigma")
    print(f"sampled values per position (n_quantile): {min(r['n_quantile'] for r in sampled)}"
          f"-{max(r['n_quantile'] for r in sampled)}")


def sorted_by_position(con) -> dict[int, np.ndarray]:
    """Every b of each position, sorted (float64)."""
    tokens = con.sql("SELECT pos, b FROM tokens").fetchnumpy()
    order = np.lexsort((tokens["b"], tokens["pos"]))
    pos, b = tokens["pos"][order], tokens["b"][order].astype(np.float64)
    bounds = np.flatnonzero(np.diff(pos)) + 1
    return {int(chunk_pos[0]): chunk for chunk_pos, chunk in zip(np.split(pos, bounds), np.split(b, bounds))}


def rank_offset(values: np.ndarray, estimate: float, p: float) -> float:
    """How far p lies outside the rank interval that ``estimate`` occupies among the sorted ``values``."""
    low, high = (np.searchsorted(values, estimate, side=side) / len(values) for side in ("left", "right"))
    return max(low - p, p - high, 0.0)


def open_store(out: Path, threads: int) -> dict:
    """The default connection and one whose quantiles are exact, each with ``threads`` DuckDB threads."""
    connections = {"default": connect(out), "exact": connect(out, quantile_tokens=None)}
    for con in connections.values():
        con.execute(f"SET threads = {threads}")
    return connections


def arguments() -> argparse.Namespace:
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
    return ap.parse_args()


def main():
    args = arguments()
    out = Path(args.out)
    t = time.perf_counter()
    if args.reuse and (out / f"fingerprint={FP}" / "manifest.json").is_file():
        print("reusing", out)
    else:
        print("store:", build_store(out, args.tokens, args.parts, (args.min_T, args.max_T), args.seed),
              f"written in {time.perf_counter() - t:.1f} s")
    size = sum(p.stat().st_size for p in out.rglob("*.parquet"))
    connections = open_store(out, args.threads)
    rows, tokens, share = connections["default"].sql(
        "SELECT count(*), sum(T), getvariable('quantile_share') FROM store_rows").fetchall()[0]
    print(f"{rows} examples, {tokens} tokens, {size / 1e6:.1f} MB of Parquet ({size / tokens:.2f} B/token), "
          f"DuckDB threads={args.threads}, {os.cpu_count()} CPUs, medians of {args.repeat} interleaved rounds; "
          f"default quantile sample: {share:.3f} of the examples")
    print_ratios(interleaved(connections, args.repeat))
    print_quantile_error(connections)


if __name__ == "__main__":
    main()
