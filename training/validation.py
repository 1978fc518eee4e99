"""The validation pass of a train run (and of ``tokweight eval``): per-example records over a
split, gathered across ranks, finalised into metrics and appended to RUN/metrics.jsonl by rank 0."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from training.baselines import Baseline
from training.cvae import CVAE, CVAEConfig
from training.data import EvalStream, StreamSpec, loader
from training.losses import WeightingParams, example_kl, reconstruction_weights, weighted_reconstruction
from training.metrics import EvalRecords
from training.run_dir import append_metrics
from training.train_config import LossConfig


@dataclass(frozen=True)
class Scoring:
    """What turns a model's outputs on a split into the run's numbers."""

    baseline: Baseline
    """Where b comes from: the run's policy (eval: the baseline checkpoint for a split the store lacks)."""
    loss: LossConfig
    """The run's weighting and lambda: the reported recon is the trained one."""
    params: WeightingParams
    """eps, eps_inv and the dataset's mean b."""
    cvae: CVAEConfig
    """The latent's kind and K (continuous: the k-means clusters of the strategy metrics)."""
    seed: int
    """Seeds the continuous latent's noise and the k-means."""

    def metrics(self, records: EvalRecords) -> dict:
        return records.finalize(self.cvae.latent, self.cvae.k, self.seed)


@torch.no_grad()
def evaluate_pass(model: CVAE, batches, scoring: Scoring, device) -> EvalRecords:
    """Per-example recon (weighted and uniform), KL and posterior over the batches (this rank's)."""
    model.eval()
    records, loss = EvalRecords(), scoring.loss
    for batch in batches:
        batch = batch.to(device)
        out = model(batch, generator=torch.Generator().manual_seed(scoring.seed))
        b = scoring.baseline(batch, out)
        pi, degenerate = reconstruction_weights(loss.weighting, b, batch.zfree.mask, scoring.params,
                                                loss.token_weighted_reconstruction_weight)
        pi_u, _ = reconstruction_weights("uniform", b, batch.zfree.mask, scoring.params)
        recon = model.latent.expectation(weighted_reconstruction(out.nll, pi), out.post)
        recon_u = model.latent.expectation(weighted_reconstruction(out.nll, pi_u), out.post)
        kl = model.latent.kl(out.post, out.prior)
        discrete = model.latent.kind == "discrete"
        post, logvar = (out.post.exp(), None) if discrete else out.post  # q (B, K), or mu and logvar (B, D)
        records.add(recon, recon_u, example_kl(kl), post, list(batch.strategies), degenerate, logvar)
    model.train()
    return records


def gather_records(records: EvalRecords, world: int) -> EvalRecords:
    """One collective after the loop: every rank's records to every rank."""
    if world == 1:
        return records
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, records)
    return EvalRecords().merge(everyone)


def validate(model: CVAE, scoring: Scoring, spec: StreamSpec, *, split: str, step: int, world: int, device,
             log: Path | None, examples: int | None = None) -> dict:
    """Metrics over the split ``spec`` reads (its first ``examples`` rounded up to whole batches; None: all),
    appended to ``log``/metrics.jsonl when given (rank 0's run directory)."""
    batches = loader(EvalStream(spec), 0)
    if examples is not None:
        batches = islice(batches, -(-examples // spec.batch_size))
    records = gather_records(evaluate_pass(model, batches, scoring, device), world)
    metrics = {"split": split, "step": step, **scoring.metrics(records)}
    if log is not None:
        append_metrics(log, metrics)
    return metrics
