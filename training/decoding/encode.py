"""`tokweight encode`: every example's posterior over a split, as a Parquet file that `tokweight sql` joins
with the store by key.

One row per example the split's stream keeps, in stream order, with the columns:

- ``key``, ``split``, ``strategy`` (the label, null without one), ``fingerprint`` (of the baseline store the
  run trained against, so a store holding several fingerprints joins on (fingerprint, key));
- discrete: ``q`` (list of K probabilities q(z | x, y)); continuous: ``mu`` and ``sigma`` (lists of D);
- ``latent``: the example's latent value: argmax q, or (continuous) its cluster among the K k-means centres
  of the split's mu, seeded as eval seeds them, so it indexes the same values as eval's and generate's;
- ``kl`` (nats): KL(q(z | x, y) || p(z | x)).

The posteriors come from eval's pass (``validation.evaluate_pass``), with b as eval takes it where the posterior
reads the likelihood on the examples the E-step is sure of (``cvae.posterior_likelihood``; q* reads b): the
store, or the baseline checkpoint for a split the store lacks. A posterior that does not reads x and y only, and
the pass takes b from the run's own backbone (policy dynamic): no store and no base checkpoint are read.
Written to ``RUN/posteriors-<split>.parquet`` by default, where ``tokweight sql STORE --run RUN`` finds it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokweight.pipeline.models.backbone import load_backbone
from tokweight.pipeline.models.dtypes import resolve_dtype
from tokweight.pipeline.ranks import resolve_device
from tokweight.store.sql import POSTERIORS_FILE
from tokweight.training.objective.baselines import Frozen, make_baseline
from tokweight.training.config.components import WeightingParams
from tokweight.training.loop.batches import StreamSpec
from tokweight.pipeline.data.splits import split_urls
from tokweight.training.evaluation.evaluate import eval_baseline, split_clusters
from tokweight.training.loop.run_dir import load_run
from tokweight.training.objective.schedules import Schedule
from tokweight.training.config.use import EncodeConfig
from tokweight.training.loop.stream import EvalStream, loader
from tokweight.training.evaluation.validation import PassRecords, Scoring, evaluate_pass


def out_path(cfg: EncodeConfig) -> Path:
    """The Parquet file to write: ``cfg.out``, or RUN/posteriors-<split>.parquet (where `tokweight sql --run`
    looks)."""
    return Path(cfg.out) if cfg.out else Path(cfg.run) / POSTERIORS_FILE.format(split=cfg.split)


def load_trained(run: str, device: str, dtype: str = "float32"):
    """``load_run``'s (config, model, vocab, state) on ``device`` in ``dtype`` ("auto" resolved there), with a missing
    checkpoint said as what to do."""
    device = resolve_device(device)
    try:
        return load_run(run, device, resolve_dtype(dtype, device))
    except FileNotFoundError as e:
        raise ValueError(f"{e}; train one with `tokweight train --out {run}` (a run writes RUN/checkpoint/ "
                         "every --ckpt-every steps and at its end)") from None


def posterior_pass(model, tcfg, meta: dict, vocab, data: str, split: str, batch_size: int) -> PassRecords:
    """Eval's pass over the split (its records: post, logvar, kl, key, strategy), b as eval takes it where q reads
    it, else from the run's own backbone."""
    params = WeightingParams(tcfg.loss.eps, tcfg.loss.eps_inv, meta.get("dataset_mean_b"))
    urls, at = split_urls(data, split), Schedule.of(tcfg).at(meta["step"] - 1)  # q as the run's last step read it
    device = next(model.parameters()).device
    policy, store = "dynamic", None
    if at.reads_likelihood:
        policy, store, _ = eval_baseline(tcfg.loss.policy, tcfg.io, meta, vocab, urls, data, split)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")  # the base in the run model's dtype
    baseline = (Frozen.loaded(load_backbone(tcfg.io.baseline_source, device=device, dtype=dtype,
                                            template=vocab.template).model)
                if policy == "frozen" else make_baseline(policy, None))
    scoring = Scoring(baseline, tcfg.loss, params, tcfg.cvae, tcfg.optim.seed, at)
    spec = StreamSpec(urls=urls, vocab=vocab, slots=tcfg.cvae.slots, block_size=model.backbone.cfg.block_size,
                      batch_size=batch_size, store=store, root=data, on_bad_sample=tcfg.io.on_bad_sample)
    records = evaluate_pass(model, loader(EvalStream(spec), 0), scoring, device)
    model.eval()  # evaluate_pass hands the model back in train mode, for the training loop
    return records


def posterior_table(records: PassRecords, cvae, seed: int, split: str, fingerprint: str) -> pa.Table:
    """The rows the module's docstring lists; ``latent`` from eval's own ``split_clusters``."""
    post = np.stack(records.rows["post"])  # (N, K) q, or (N, D) mu
    _, clusters = split_clusters(post, cvae, seed)
    n = len(post)
    columns = {"key": pa.array(records.rows["key"], pa.string()), "split": pa.array([split] * n, pa.string()),
               "strategy": pa.array(records.rows["strategy"], pa.string()),
               "fingerprint": pa.array([fingerprint] * n, pa.string())}
    if cvae.latent == "discrete":
        columns["q"] = pa.array(post.tolist(), pa.list_(pa.float64()))
    else:
        sigma = np.exp(0.5 * np.stack(records.rows["logvar"]))
        columns |= {"mu": pa.array(post.tolist(), pa.list_(pa.float64())),
                    "sigma": pa.array(sigma.tolist(), pa.list_(pa.float64()))}
    columns |= {"latent": pa.array(clusters, pa.int32()), "kl": pa.array(records.rows["kl"], pa.float64())}
    return pa.table(columns)


def write_table(table: pa.Table, path: Path) -> None:
    """Written under a temporary name and renamed: an interrupted encode leaves no half file for sql to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def run(cfg: EncodeConfig) -> dict:
    tcfg, model, vocab, meta = load_trained(cfg.run, cfg.device, cfg.dtype)
    records = posterior_pass(model, tcfg, meta, vocab, cfg.data, cfg.split, cfg.batch_size)
    if not records.rows["key"]:
        raise ValueError(f"split {cfg.split!r} of {cfg.data} has no example the stream keeps: nothing to encode")
    table = posterior_table(records, tcfg.cvae, tcfg.optim.seed, cfg.split, meta["baseline_fingerprint"])
    write_table(table, out_path(cfg))
    return {"out": str(out_path(cfg)), "split": cfg.split, "examples": table.num_rows, "latent": tcfg.cvae.latent,
            "latent_values": tcfg.cvae.k, "columns": table.column_names, **records.skips.to_json()}
