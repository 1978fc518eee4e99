"""One optimizer step: forward, the objective (``loss.step_loss``), backward, the update.

``train_step`` is the whole of it; the metrics record (``diagnostics``) is made on logged steps only, since
its ``.item()`` calls wait for the device. A step that does not log makes no host sync at all: what it slices
with comes with the batch as host ints (``batches.Widths``, ``Batch.s_tokens``), and ``tests/training/loop/test_sync_guard.py``
fails any read-back. Several ranks average their gradients through
DistributedDataParallel or FSDP2 (``state.engine``, ``engine.py``), overlapped with the backward; the terms that
couple a batch's examples are computed over the global batch (``global_batch.py``), so N ranks with batch B step
like one process with batch N * B, and log it (``global_record``).
"""

from __future__ import annotations

import numpy as np
import torch

from tokweight.training.config.components import WeightingParams
from tokweight.training.cvae.model import CVAE
from tokweight.training.loop.batches import TrainBatch
from tokweight.training.objective.estep import step_labels
from tokweight.training.objective.global_batch import GlobalBatch
from tokweight.training.objective.terms import example_kl, reconstruction_weights, weighted_reconstruction
from tokweight.training.evaluation.metrics import entropy, informative_token_spread, posterior_gradient_norms
from tokweight.training.objective.loss import Terms, step_loss
from tokweight.training.loop.precision import autocast
from tokweight.training.objective.schedules import lr_at
from tokweight.training.loop.state import State


def sample_generator(seed: int, step: int) -> torch.Generator:
    """The continuous latent's noise for one step's global batch, the same on every rank: a function
    of (seed, step), so resumes repeat it. The 0 in the seed sequence is fixed: changing it changes every
    continuous run's noise."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 0, step]).generate_state(1)[0]))


def train_step(state: State, batch: TrainBatch, cfg, logged: bool) -> dict | None:
    """One optimizer step on ``batch`` (on the model's device) at the step's learning rate; the metrics record
    on a logged step, else None. ``cfg``: the run's TrainConfig."""
    progress = state.progress
    lr = lr_at(cfg.optim.lr, progress.step, progress.decay_window(cfg.optim.steps, cfg.optim.lr_decay))
    with autocast(cfg.io.dtype, state.device):
        out, b, terms = step_terms(state, batch, cfg)
    every = cfg.log.grad_diag_every
    record = diagnostics(state, batch, out, b, terms, lr, bool(every and progress.step % every == 0)) if logged else None
    state.opt.zero_grad(set_to_none=True)
    terms.loss.backward()  # DistributedDataParallel averages (FSDP reduce-scatters) the gradients over the ranks here
    optimizer_step(state, cfg.optim.grad_clip, lr)
    progress.step += 1
    return record


def step_terms(state: State, batch: TrainBatch, cfg) -> tuple[object, torch.Tensor, Terms]:
    """The forward pass, b (the policy's) and the step's objective at the step's schedule (``state.schedule``):
    (the CVAE's outputs, b (B, T_max) nats over S, the terms)."""
    at = state.schedule.at(state.progress.step)
    out = state.engine(batch, generator=sample_generator(cfg.optim.seed, at.step), global_batch=state.global_batch)
    b = state.baseline(batch, out)  # (B, T_max) nats over S, detached
    labels = (step_labels(at.estep, batch.strategies, state.strategy_names, batch.keys)
              if at.em and state.strategy_names else None)  # (B,) label indices, -1: unlabelled
    pairs = state.label_values if labels is not None else None  # estep.label_map "matched"
    values = labels if pairs is None else pairs.assign(labels)  # (B,) the value each labelled line is fixed to
    log_pi = state.clusters.log_prob(out.pooled) if state.clusters is not None and at.em else None  # (B, K)
    table = state.agreement if log_pi is not None else None  # estep.cluster_map "agreement" or "matched"
    cluster = log_pi if table is None else table.tilt(log_pi)
    terms = step_loss(state.model.latent, out, b, batch.zfree.mask, cfg.loss, at, state.params, values,
                      state.global_batch, cluster)
    if table is not None:
        table.update(log_pi, terms.R, state.global_batch)  # after the step read it: the next step's table
    if pairs is not None:
        pairs.update(labels, terms.R, state.global_batch)  # likewise
    return terms.out, b, terms


def build_optimizer(params: list[torch.nn.Parameter], lr: float, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW over the trained parameters, without weight decay; fused when they are all on CUDA (``fuses``), or as
    ``fused`` says (the planner's, which plans a CUDA run on the CPU)."""
    fused = fuses(params) if fused is None else fused
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95), fused=True if fused else None)


def fuses(params) -> bool:
    """Whether AdamW runs fused over ``params``: when every one is on CUDA. One kernel then updates them all and
    keeps the step counters on the device; elsewhere torch's default (per-parameter or foreach kernels)."""
    params = list(params)
    return bool(params) and all(p.device.type == "cuda" for p in params)


def optimizer_step(state: State, grad_clip: float, lr: float) -> None:
    params = [p for p in state.model.parameters() if p.requires_grad]
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for group in state.opt.param_groups:
        group["lr"] = lr
    state.opt.step()


def diagnostics(state: State, batch: TrainBatch, out, b: torch.Tensor, terms: Terms, lr: float,
                gradient_norms: bool) -> dict:
    """The step's metrics record, over the global batch (``global_record``). The posterior-gradient norms need the
    graphs: before the backward."""
    model, obj, ranks = state.model, terms.obj, state.global_batch
    record = {"step": state.progress.step, "loss": obj.loss.item(), "recon": obj.recon.item(),
              "kl": example_kl(obj.kl).mean().item(), "kl_term": obj.kl_term.item(), "beta": terms.beta,
              "lr": lr, "anchor": terms.anchor.item(), "degenerate": int(terms.degenerate.sum()),
              "estep": terms.estep, **latent_summary(model, out, batch, state.params, terms.R, b)}
    if gradient_norms:
        record |= posterior_gradient_norms(obj.recon, terms.beta * obj.kl_term, model.posterior_parameters,
                                           ranks.average)
    return global_record(record, ranks, state.device)


def global_record(record: dict, ranks: GlobalBatch, device: torch.device) -> dict:
    """A metrics record of this rank's rows -> the global batch's, so that N ranks log what one process logs: every
    number (a list's too) averaged over the ranks, which hold equal rows (a batch mean's mean is the global mean;
    the step's settings are the same on every rank), the count of degenerate examples summed. One all_reduce."""
    if ranks.world == 1:
        return record
    keys = [k for k, v in record.items() if k not in ("step", "estep") and isinstance(v, (int, float, list))]
    values = [record[k] if isinstance(record[k], list) else [record[k]] for k in keys]
    flat = iter(ranks.average(torch.tensor(sum(values, []), dtype=torch.float64, device=device)).tolist())
    means = {k: [next(flat) for _ in v] for k, v in zip(keys, values)}
    out = {k: m if isinstance(record[k], list) else m[0] for k, m in means.items()}
    out["degenerate"] = round(out["degenerate"] * ranks.world)
    return record | out


@torch.no_grad()
def latent_summary(model: CVAE, out, batch: TrainBatch, params: WeightingParams, Rw: torch.Tensor,
                   b: torch.Tensor) -> dict:
    """Uniform reconstruction E_q[sum_t l_t / T]; discrete: mean H(q), the spreads
    mean_i (max_k R_ik - min_k R_ik) of the uniform R and of the trained (weighted) R ``Rw`` (B, K), the step's,
    across latent values, the same spread of l_t at the example's most surprising token
    (``l_t0_spread``: the decoder's response to z where z can help), usage mean_i q_i, and
    argmin_usage: the share of examples whose weighted R is lowest at k (where a hard E-step
    would send them)."""
    pi_u, _ = reconstruction_weights("uniform", out.zfree_nll, batch.zfree.mask, params)
    R = weighted_reconstruction(out.nll, pi_u)  # (B, copies)
    summary = {"recon_uniform": model.latent.expectation(R, out.post).mean().item()}
    if model.latent.kind == "discrete":
        q = out.post.exp()
        winners = torch.bincount(Rw.argmin(1), minlength=model.latent.k) / len(Rw)
        summary |= {"q_entropy": float(entropy(q.cpu().numpy()).mean()),
                    "R_spread": (R.max(1).values - R.min(1).values).mean().item(),
                    "R_spread_weighted": (Rw.max(1).values - Rw.min(1).values).mean().item(),
                    "l_t0_spread": informative_token_spread(out.nll, b, batch.zfree.mask).mean().item(),
                    "usage": q.mean(0).tolist(), "argmin_usage": winners.tolist()}
    return summary
