"""What a dataset knows of its own ground truth: one interface for training, evaluation and inspection.

Read from the dataset's ``dataset.json`` (beside its shards: in its folder, or at the root of
its URLs) and its samples, never from how it was made:
``synth`` data implements all of it (the generator can say what each strategy outputs),
converted data as far as its labels go (the ``strategy`` and ``t0`` of its lines), and a
folder of foreign shards only what its samples carry.

| member                       | synth           | convert                  | other |
|------------------------------|-----------------|--------------------------|-------|
| ``strategies``               | generator order | sorted labels, if any    | ()    |
| ``outputs(x)``               | strategy -> y   | None                     | None  |
| ``consistent_at_t0(sample)`` | a count         | None                     | None  |
| ``shard_labels(path)``       | (key, strategy, t0) of each sample, whatever made the data  |||
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import dataset_json, iter_samples, resolve_shards
from tokweight.pipeline.data.config import SynthConfig
from tokweight.pipeline.data.synth import consistent_at_t0, symbol_candidates


@dataclass(frozen=True)
class DatasetLabels:
    source: str
    """What made the dataset: "tokweight.synth", "tokweight.convert", or "unknown"."""
    strategies: tuple[str, ...] = ()
    """The strategy labels in a fixed order (label k of an E-step that reads them is strategies[k]); () if none."""
    synth: SynthConfig | None = None
    """The generator config, for synthetic data."""

    def outputs(self, x: tuple[str, ...]) -> dict[str, tuple[str, ...]] | None:
        """strategy -> the y it produces for x: a decode can be checked against each; None where unknown."""
        if self.synth is None:
            return None
        return {name: seq[:-1] for name, seq in symbol_candidates(x, self.synth).items()}

    def consistent_at_t0(self, sample: Sample) -> int | None:
        """Strategies consistent with the sample's prefix at its t0 (the Bayes surprisal is its log); None if unknown."""
        return consistent_at_t0(sample, self.synth) if self.synth is not None else None


def load_labels(data: str | Path) -> DatasetLabels:
    """The labels of dataset ``data``, a directory or URLs (its dataset.json; none: unlabelled shards)."""
    info = dataset_json(data)
    if info is None:
        return DatasetLabels("unknown")
    if info.get("generator") == "tokweight.synth":
        synth = SynthConfig(**info["config"])
        return DatasetLabels("tokweight.synth", tuple(synth.strategies), synth)
    return DatasetLabels(info.get("generator", "unknown"), tuple(info.get("strategies", ())))


def shard_labels(path: str | Path) -> list[tuple[str, str | None, int | None]]:
    """(key, strategy, t0) of every sample of one shard, in file order."""
    return [(s.key, s.strategy, s.t0) for _, s in iter_samples([path])]


def ground_truth_from_data(store: str | Path, fingerprints: list[str], data: str | Path) -> pa.Table:
    """(fingerprint, shard, key, strategy, t0) of every sample in ``data`` whose shard the store holds.

    A data shard is matched to a manifest input by size and sha256 (so a moved dataset
    still matches; a URL by the URL it was extracted from), and ``shard`` is that input's name,
    as in the stored rows.
    """
    from tokweight.store.baseline_store import BaselineStore

    base = BaselineStore(store)
    views = [base.open(fp) for fp in fingerprints or base.fingerprints()]
    _, paths = resolve_shards(data)
    columns = {"fingerprint": [], "shard": [], "key": [], "strategy": [], "t0": []}
    for path in paths:
        names = {}  # fingerprint -> the input name this shard has there
        for view in views:
            try:
                names[view.fingerprint] = view.input_for_shard(path)["name"]
            except KeyError:
                continue  # not extracted into this fingerprint
        if not names:
            continue
        samples = shard_labels(path)  # read once for every fingerprint
        for fp, name in names.items():
            for row in samples:
                for col, value in zip(columns, (fp, name, *row)):
                    columns[col].append(value)
    return pa.table({k: pa.array(v, pa.int32() if k == "t0" else pa.string()) for k, v in columns.items()})
