"""The validation pass of a train run: per-example records over a split, gathered across
ranks, finalised into metrics and appended to RUN/metrics.jsonl by rank 0."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from training.baselines import Baseline
from training.cvae import CVAE
from training.data import EvalStream, loader, split_urls
from training.losses import WeightingParams, example_kl, reconstruction_weights, weighted_reconstruction
from training.metrics import EvalRecords

if TYPE_CHECKING:
    from training.train import State, TrainConfig


@torch.no_grad()
def evaluate_pass(model: CVAE, batches, baseline: Baseline, cfg: TrainConfig, params: WeightingParams,
                  device) -> EvalRecords:
    """Per-example recon (weighted and uniform), KL and posterior over the batches (this rank's)."""
    model.eval()
    records = EvalRecords()
    for batch in batches:
        batch = batch.to(device)
        out = model(batch, generator=torch.Generator().manual_seed(cfg.seed))
        b = baseline(batch, out)
        pi, degenerate = reconstruction_weights(cfg.weighting, b, batch.zfree.mask, params,
                                                cfg.token_weighted_reconstruction_weight)
        pi_u, _ = reconstruction_weights("uniform", b, batch.zfree.mask, params)
        recon = model.latent.expectation(weighted_reconstruction(out.nll, pi), out.post)
        recon_u = model.latent.expectation(weighted_reconstruction(out.nll, pi_u), out.post)
        kl = model.latent.kl(out.post, out.prior)
        post = out.post.exp() if model.latent.kind == "discrete" else out.post[0]
        records.add(recon, recon_u, example_kl(kl), post, list(batch.strategies), degenerate)
    model.train()
    return records


def gather_records(records: EvalRecords, world: int) -> EvalRecords:
    """One collective after the loop: every rank's records to every rank."""
    if world == 1:
        return records
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, records)
    return EvalRecords().merge(everyone)


def validate(state: State, split: str = "val", examples: int | None = None) -> dict:
    """Metrics over the split (its first ``examples`` rounded up to whole batches; None: all), logged."""
    cfg = state.cfg
    spec = replace(state.spec, urls=split_urls(cfg.data, split), batch_size=cfg.eval_batch_size)
    batches = loader(EvalStream(spec), 0)
    if examples is not None:
        batches = islice(batches, -(-examples // cfg.eval_batch_size))
    records = gather_records(evaluate_pass(state.model, batches, state.baseline, cfg, state.params, state.device),
                             state.world)
    metrics = {"split": split, "step": state.step,
               **records.finalize(cfg.cvae.latent, cfg.cvae.k, cfg.seed)}
    if state.rank == 0:
        with (Path(cfg.out) / "metrics.jsonl").open("a") as log:
            log.write(json.dumps(metrics) + "\n")
    return metrics
