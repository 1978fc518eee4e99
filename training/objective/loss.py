"""The objective a step trains: *the* loss of the method, in one place.

The CVAE's forward (``cvae.py``) gives, for every example, the per-token NLL of S under each decoder copy
l_t(k) (discrete: one copy per latent value k; continuous: one per draw z_s), the posterior q(k|x, y) and the
prior p(k|x). The baseline (``baselines.py``) gives b_t, the z-free base model's surprisal. Then:

    pi_t  = share of b_t in the example's S       (the weighting; surprisal-share: b_t / sum_s b_s)
    R(k)  = sum_t pi_t l_t(k)                      reconstruction under copy k, nats
    a(k)  = q*(k) ∝ p(k|x) exp(-R(k) / beta)       the E-step: which copy explains the example, detached
    J     = mean_i w_i [sum_k a_ik R_ik + CE(a_i, q_i)] + beta KL(a || p) + w_anchor anchor

The E-step is the exact minimiser of J over q for the current decoder (``estep.py``); the decoder copies learn
from the examples assigned to them, the amortised posterior q is distilled to a, and the prior fits a through
beta * KL. Once the hardening acts, q adds log p(y|x,k) = -sum_t l_t(k) to its head on the examples q* is sure of
(``estep.LikelihoodRead``), before any of this reads it. w_i = 1, except with a few labelled examples
(``estep.labelled``): they carry a fixed share of the batch's fit (``estep.labelled_weight``) however few they
are. The anchor term keeps every token within a margin of the base model's loss (``losses.anchor_penalty``). With
the E-step off, J is the plain ELBO-style objective E_q[R] + beta KL(q || p).

Everything here is a pure function of tensors; the weightings are named objects in ``losses.WEIGHTINGS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokweight.training.config.cvae import EStepConfig
from tokweight.training.objective.estep import (LikelihoodRead, assigned_reconstruction, assignment, assignment_kl,
                                      distillation, labelled_weights)
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch
from tokweight.training.objective.terms import (WeightingParams, anchor_penalty, free_bits_kl, reconstruction_weights,
                                       weighted_reconstruction)


@dataclass
class Objective:
    loss: torch.Tensor  # () what is optimised: fit + beta * kl_term
    recon: torch.Tensor  # () batch mean of E_q[R(z)] under the amortised posterior (reported under the E-step)
    kl_term: torch.Tensor  # () the KL as optimised (free bits applied)
    kl: torch.Tensor  # (B,) or (B, D) KL(q || p) of the amortised posterior, nats


@dataclass
class Terms:
    """One step's objective and what its diagnostics read."""

    obj: Objective
    out: object  # the CVAE's outputs the objective read: the forward's, its posterior read with the likelihood
    loss: torch.Tensor  # () what the step backpropagates: the objective, plus the anchor term when it acts
    anchor: torch.Tensor  # () the anchor term, measured whatever its weight
    pi: torch.Tensor  # (B, T) the reconstruction's token weights
    degenerate: torch.Tensor  # (B,) bool: weights fell back to uniform
    beta: float
    estep: bool  # whether the E-step objective was the one optimised


def step_loss(latent, out, b: torch.Tensor, mask: torch.Tensor, loss, estep: EStepConfig, step: int,
              params: WeightingParams, labels: torch.Tensor | None = None, batch: GlobalBatch = LOCAL,
              read: LikelihoodRead | None = None) -> Terms:
    """J for one batch: ``out`` the CVAE's outputs, b (B, T) nats over S (detached), mask (B, T); ``loss`` a
    ``LossConfig``; labels (B,) strategy indices for an E-step that reads them; ``batch`` the global batch;
    ``read``: where the posterior reads y's likelihood this step (``TrainConfig.likelihood_read``)."""
    pi, degenerate = reconstruction_weights(loss.weighting, b, mask, params,
                                            loss.token_weighted_reconstruction_weight, batch)  # (B, T)
    if read is not None:
        out = read(out, pi)
    beta, em = loss.beta_at(step), estep.active(step)
    obj = (em_objective(latent, out, pi, beta, loss.free_bits, estep.at(step), labels, batch) if em
           else plain_objective(latent, out, pi, beta, loss.free_bits, batch))
    anchor = anchored(latent, out, b, mask, loss.anchor_margin)
    anchor_weight = loss.anchor_weight_at(step)
    total = obj.loss + anchor_weight * anchor if anchor_weight else obj.loss
    return Terms(obj, out, total, anchor, pi, degenerate, beta, em)


def plain_objective(latent, out, pi: torch.Tensor, beta: float, free_bits: float = 0.0,
                    batch: GlobalBatch = LOCAL) -> Objective:
    """J = mean_i E_q[R_i(z)] + beta * KL(q || p): the copies weighted by the amortised posterior."""
    R = weighted_reconstruction(out.nll, pi.to(out.nll.dtype))  # (B, copies) nats
    recon = latent.expectation(R, out.post).mean()
    kl = latent.kl(out.post, out.prior)
    kl_term = free_bits_kl(kl, free_bits, batch)
    return Objective(recon + beta * kl_term, recon, kl_term, kl)


def em_objective(latent, out, pi: torch.Tensor, beta: float, free_bits: float, cfg: EStepConfig,
                 labels: torch.Tensor | None = None, batch: GlobalBatch = LOCAL) -> Objective:
    """J_EM = mean_i [sum_c a_ic R_ic + CE(a_i, q_i)] + beta * KL(a || p), a = the E-step's assignment
    (detached): the decoder copies learn from a, the amortised posterior is distilled to a, and the prior fits a
    through beta * KL, which is J's own prior gradient at q = a. The posterior gets no KL gradient: a already
    holds beta. Reported: ``recon`` = E_q[R] and ``kl`` = KL(q || p), as in the plain objective.

    A continuous latent's copies are S draws z_s from q rather than every value, so a is the self-normalised
    importance weight of q*(z) = p(z|x) exp(-R(z) / beta) / Z with q as the proposal (reweighted wake-sleep,
    Bornschein & Bengio 2015): log p - log q enters where the discrete prior does, and the KL's gradient
    reaches the prior only.
    """
    R = weighted_reconstruction(out.nll, pi.to(out.nll.dtype))  # (B, copies) nats
    z = None if out.z is None else out.z.detach()  # each copy's value: q and p fit it, not move it
    log_p, log_q = latent.log_density(out.prior, z), latent.log_density(out.post, z)  # (B, copies) each
    log_target = log_p - log_q.detach() if latent.sampled else log_p  # the E-step's p, by the proposal
    a = assignment(R, log_target, cfg, beta, labels, batch)  # (B, copies)
    assigned, distilled = assigned_reconstruction(R, a), distillation(log_q, a)  # (B,) each
    fit = assigned.mean() + distilled.mean()
    if labels is not None:  # weighed where the global batch holds both kinds (chosen on the device: no host sync)
        w, weighted = labelled_weights(labels.to(R.device), cfg.labelled_weight, batch)  # (B,), ()
        fit = torch.where(weighted, (w.to(R.dtype) * (assigned + distilled)).mean(), fit)
    if latent.sampled:  # q*'s density at its draws, log q + log(S a)
        log_a = log_q.detach() + torch.log(a * a.shape[-1])
        kl = (torch.where(a > 0, a * log_a, 0) - a * log_p).sum(-1)
    else:
        kl = assignment_kl(a, log_p)
    kl_term = free_bits_kl(kl, free_bits, batch)
    recon = latent.expectation(R, out.post).mean().detach()
    return Objective(fit + beta * kl_term, recon, kl_term, latent.kl(out.post, out.prior).detach())


def anchored(latent, out, b: torch.Tensor, mask: torch.Tensor, margin: float) -> torch.Tensor:
    """() the batch mean of E_q[anchor_penalty], q detached: the term keeps the decoder whole, it does not move
    the posterior."""
    penalty = anchor_penalty(out.nll, b, mask, margin)  # (B, copies) nats
    return latent.expectation(penalty, detach(out.post)).mean()


def detach(value):
    return value.detach() if isinstance(value, torch.Tensor) else tuple(v.detach() for v in value)
