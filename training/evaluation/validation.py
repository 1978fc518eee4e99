"""The validation pass of a train run (and of ``tokweight eval``): per-example records over a
split, gathered across ranks, finalised into metrics and appended to RUN/metrics.jsonl by rank 0.
The samples the stream left out (``data.EvalStream``'s ``Skips`` items) are counted with the
records and reported in the metrics (``skipped``, ``skipped_shards``) when there are any."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tokweight.pipeline.data.errors import Skips
from tokweight.training.objective.baselines import Baseline
from tokweight.training.cvae.model import CVAE, CVAEConfig
from tokweight.training.loop.batches import StreamSpec, TrainBatch
from tokweight.training.config.components import WeightingParams
from tokweight.training.objective.estep import read_likelihood
from tokweight.training.objective.terms import example_kl, reconstruction_weights, weighted_reconstruction
from tokweight.training.evaluation.metrics import EvalRecords
from tokweight.training.objective.loss import reconstruction
from tokweight.training.loop.run_dir import append_metrics
from tokweight.training.objective.schedules import StepSchedule
from tokweight.training.loop.stream import EvalStream, loader
from tokweight.training.config.train import LossConfig


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
    at: StepSchedule | None = None
    """The schedule of the run's last step (``Schedule.at(steps - 1)``): where it reads y's likelihood
    (``reads_likelihood``), the posterior is read so; None: the head's posterior alone."""

    def metrics(self, records: EvalRecords) -> dict:
        skipped = records.skips.to_json() if isinstance(records, PassRecords) else {}
        return records.finalize(self.cvae.latent, self.cvae.k, self.seed) | skipped


class PassRecords(EvalRecords):
    """An eval pass's per-example records and the samples its stream left out."""

    def __init__(self):
        super().__init__()
        self.skips = Skips()

    def merge(self, others: list[PassRecords]) -> PassRecords:
        super().merge(others)
        for other in others:
            self.skips.merge(other.skips)
        return self


@dataclass(frozen=True)
class Filler:
    """A batch a rank runs again, unscored, so that its forwards' collectives meet those of ranks that still have
    batches (``lockstep``)."""

    batch: TrainBatch


@torch.no_grad()
def evaluate_pass(model: CVAE, batches: Iterable[TrainBatch | Skips | Filler], scoring: Scoring,
                  device) -> PassRecords:
    """Per-example recon (weighted and uniform), KL, posterior and (discrete) y's NLL under each latent value over
    the batches (this rank's), and the samples the stream skipped (its ``Skips`` items); a ``Filler`` runs every
    forward a batch runs and records nothing."""
    model.eval()
    records, loss = PassRecords(), scoring.loss
    for batch in batches:
        if isinstance(batch, Skips):
            records.skips.merge(batch)
            continue
        filler = isinstance(batch, Filler)
        batch = (batch.batch if filler else batch).to(device)
        out = model(batch, generator=torch.Generator().manual_seed(scoring.seed))
        b = scoring.baseline(batch, out)
        pi, degenerate = reconstruction_weights(loss.weighting, b, batch.zfree.mask, scoring.params,
                                                loss.token_weighted_reconstruction_weight)
        pi_u, _ = reconstruction_weights("uniform", b, batch.zfree.mask, scoring.params)
        R = reconstruction(out, pi)  # (B, copies) nats
        if scoring.at is not None and scoring.at.reads_likelihood:
            out = read_likelihood(out, R, scoring.at.estep, scoring.at.beta)
        recon = model.latent.expectation(R, out.post)
        recon_u = model.latent.expectation(weighted_reconstruction(out.nll, pi_u), out.post)
        kl = model.latent.kl(out.post, out.prior)
        discrete = model.latent.kind == "discrete"
        post, logvar = (out.post.exp(), None) if discrete else out.post  # q (B, K), or mu and logvar (B, D)
        mask = batch.zfree.mask
        nll_matched = matched_nll(model, batch, out)
        if filler:
            continue
        records.add(recon, recon_u, example_kl(kl), post, list(batch.strategies), degenerate, logvar,
                    nll_matched=nll_matched, nll_by_value=out.nll.sum(-1) if discrete else None,
                    b_sum=(b * mask).sum(1), tokens=mask.sum(1), keys=list(batch.keys))
    model.train()
    return records


def matched_nll(model: CVAE, batch: TrainBatch, out) -> torch.Tensor:
    """(B,) nats: sum over S of l_t under each example's own latent value, the one its posterior picks
    (discrete: argmax q; continuous: the posterior's mean, one more forward at one copy per example). Not a
    draw: a draw's NLL measures how far q's noise carries z, not the decoder eval's decodes judge. Masked
    positions hold 0."""
    if model.latent.kind == "continuous":
        return model(batch, at_posterior_mean=True).nll[:, 0].sum(-1)
    k = out.post.argmax(1)  # (B,)
    return out.nll[torch.arange(len(k), device=k.device), k].sum(-1)


def gather_records(records: PassRecords, world: int) -> PassRecords:
    """One collective after the loop: every rank's records (and skips) to every rank."""
    if world == 1:
        return records
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, records)
    return PassRecords().merge(everyone)


def first_batches(items: Iterable[TrainBatch | Skips], n: int) -> Iterator[TrainBatch | Skips]:
    """The items up to the n-th batch (``Skips`` items are not batches); nothing is read beyond it."""
    if n < 1:
        return
    for item in items:
        yield item
        n -= not isinstance(item, Skips)
        if n == 0:
            return


def lockstep(items: Iterable[TrainBatch | Skips], device) -> Iterator[TrainBatch | Skips | Filler]:
    """Stage for a sharded model, whose every forward is a collective (FSDP): this rank's items, then, while another
    rank still has batches, its last batch again as a ``Filler`` (a rank that read none gets one of another rank's
    batches). One all_gather per batch says which ranks have one."""
    items, last = iter(items), None
    while True:
        batch = None
        for item in items:
            if not isinstance(item, Skips):
                batch = item
                break
            yield item
        flags = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(flags, torch.tensor([batch is not None, batch is None and last is None], dtype=torch.int64,
                                            device=device))
        has, needs = torch.stack(flags).bool().cpu().unbind(1)  # (world,) each
        if not has.any():
            return
        if needs.any():  # the first rank with a batch sends it to those that have none to repeat
            box = [batch.to("cpu") if batch is not None else None]
            dist.broadcast_object_list(box, src=int(has.nonzero()[0]))
            last = box[0] if last is None else last
        yield Filler(last) if batch is None else batch
        last = batch if batch is not None else last


def validate(model: CVAE, scoring: Scoring, spec: StreamSpec, *, split: str, step: int, world: int, device,
             log: Path | None, examples: int | None = None, sharded: bool = False) -> dict:
    """Metrics over the split ``spec`` reads (its first ``examples`` rounded up to whole batches; None: all),
    appended to ``log``/metrics.jsonl when given (rank 0's run directory). ``sharded``: the model is sharded over
    the ranks (FSDP), which run their batches in ``lockstep``."""
    batches = loader(EvalStream(spec), 0)
    if examples is not None:
        batches = first_batches(batches, -(-examples // spec.batch_size))
    if sharded:
        batches = lockstep(batches, device)
    records = gather_records(evaluate_pass(model, batches, scoring, device), world)
    metrics = {"split": split, "step": step, **scoring.metrics(records)}
    if log is not None:
        append_metrics(log, metrics)
    return metrics
