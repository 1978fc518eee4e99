"""Stores for the SQL and inspect tests, written through the store's own writer (store.writer.StoreWriter).

``example_rows`` draws examples whose surprisals come from a small set of values (so
ties, all-zero rows and T = 1 happen); ``write_store`` writes them as one fingerprint
directory, one part per input shard, with a committed manifest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tokweight.store.derived import derived_columns, scalar_arrays
from tokweight.store.formats import PARQUET
from tokweight.store.manifest import InputEntry, Provenance
from tokweight.store.schema import PART_SCHEMA
from tokweight.store.writer import StoreWriter, hash_inputs

VOCAB = ["<pad>", "<bos>", "<eos>", "a", "b", "c", "d", "</y>"]
TIE_VALUES = np.array([0.0, 0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0], dtype=np.float32)


def make_row(key: str, shard: str, b, *, strategy=None, t0=None, rng=None) -> dict:
    """One PART_SCHEMA row; the columns derived from b come from extraction's own definition."""
    b = np.asarray(b, dtype=np.float32)
    rng = rng or np.random.default_rng(0)
    derived = derived_columns(b, np.array([len(b)]))
    return {"key": key, "shard": shard, "T": len(b), "b": b,
            "target_id": rng.integers(0, len(VOCAB), len(b)).astype(np.int32),
            "entropy": rng.random(len(b)).astype(np.float32), "top1": rng.random(len(b)) < 0.5,
            "cumsum_b": derived["cumsum_b"], **{name: a[0].as_py() for name, a in scalar_arrays(derived).items()},
            "strategy": strategy, "t0": t0}


def example_rows(seed: int, n: int, *, max_T: int = 8, shards: int = 2, values=TIE_VALUES) -> list[dict]:
    """Random rows; b drawn from ``values`` (ties, zeros), every tenth row all zero, T from 1."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        T = int(rng.integers(1, max_T + 1))
        b = np.zeros(T, np.float32) if i % 10 == 9 else rng.choice(values, T)
        t0 = int(rng.integers(0, T)) if i % 7 else None
        rows.append(make_row(f"k{i:05d}", f"train/shard-{i % shards:06d}.tar", b,
                             strategy=["copy", "sort", None][i % 3], t0=t0, rng=rng))
    return rows


def rows_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=PART_SCHEMA)


def write_store(store: Path, fp: str, rows: list[dict], *, fmt: str = PARQUET, complete: bool = True,
                input_files: dict[str, Path] | None = None) -> Path:
    """One fingerprint directory: a part per distinct shard of ``rows`` and the manifest.

    input_files: shard name -> tar file, to record the inputs' real size and sha256.
    """
    writer = StoreWriter(store, fp, fmt)
    writer.directory.mkdir(parents=True, exist_ok=True)
    shards = sorted({r["shard"] for r in rows})
    hashed = {s.name: s for s in hash_inputs(input_files)} if input_files else {}
    records = []
    for i, shard in enumerate(shards):
        mine = [r for r in rows if r["shard"] == shard]
        name = writer.part_name(i)
        source = (hashed[shard].entry(len(mine), name) if hashed
                  else InputEntry(shard, 0, "0" * 64, samples=len(mine), part=name))
        records.append(writer.write_part(rows_table(mine), source))
    writer.commit(records, Provenance(template_version="test", checkpoint_path="none", model_config={},
                                      vocab=tuple(VOCAB), data_root=str(store)), complete=complete)
    return writer.directory


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """synth -> train-base (30 steps) -> extract on the `tiny` preset, built once per session."""
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.extract import run as extract_run
    from tokweight.config_files import preset_config
    from tokweight.pipeline.data.config import SynthConfig
    from tokweight.pipeline.data.synth import write_dataset
    from tokweight.training.config.base import BaseTrainConfig
    from tokweight.training.loop.train_base import run as train_run

    root = tmp_path_factory.mktemp("tiny_pipeline")
    data, ckpt, store = root / "data", root / "base", root / "store"
    write_dataset(preset_config(SynthConfig, "synth", "tiny", seed=0), data)
    train_run(preset_config(BaseTrainConfig, "base", "tiny", data=str(data), out=str(ckpt), steps=30))
    extract_run(ExtractConfig(checkpoint=str(ckpt), data=str(data), store=str(store), progress=False,
                              reader_process=False))
    return {"data": data, "checkpoint": ckpt, "store": store}
