"""The objective a step trains: *the* loss of the method, in one place.

The CVAE's forward (``training/cvae/model.py``) gives, for every example i, the per-token NLL l_t(c) of S under each decoder
copy c (discrete: one copy per latent value k; continuous: one per draw z_c from q), the posterior q(c|x, y) and
the prior p(c|x). The baseline (``baselines.py``) gives b_t, the z-free base model's surprisal. The step's
schedule (``schedules.StepSchedule``) gives beta, the anchor's weight w_anchor, whether the E-step is on and how
it acts, and whether the posterior reads the likelihood. ``step_loss`` computes, in this order:

    pi_it = (1 - lam) u_it + lam v_it          token weights (B, T) over S (``terms.reconstruction_weights``):
                                               u uniform 1/T, v the weighting's (surprisal-share:
                                               b_t / (sum_s b_s + eps)); u alone on a degenerate example
    R_ic  = sum_t pi_it l_t(c)                 reconstruction under copy c, (B, copies) nats, once a step
    log q_ic <- log_softmax_c(log q_ic - m_i sum_t l_t(c))
                                               the likelihood read, where the schedule says: Bayes' rule with
                                               the head as the prior; m_i = 1 on the examples the E-step is
                                               sure of, else 0 (``estep.read_likelihood``); the likelihood is
                                               detached, and everything below reads this q
    A     = mean_i sum_c sg(q_ic) mean_t relu(l_t(c) - b_t - margin)        the anchor term, q detached

    E-step on:  a_i = q*_i, detached: q*(c) ∝ p(c|x) exp(-R_ic / beta) (``estep.assignment``, with its
                hardening, balance, labels, head and cluster weights as configured; at beta = 0 under follow_beta the
                argmin of R)
        J = mean_i w_i [sum_c a_ic R_ic - sum_c a_ic log q_ic] + beta FB(KL(a_i || p_i)) + w_anchor A
    E-step off:
        J = mean_i sum_c q_ic R_ic + beta FB(KL(q_i || p_i)) + w_anchor A

    FB(KL) = sum_d max(lambda, mean_i KL_id)   the free-bits floor lambda (0: the batch mean KL)

A mean over i is over this rank's rows, whose gradients the ranks average, so N ranks train on the global batch's
mean; the terms that couple a batch's examples (FB's mean, the E-step's balance and labelled weights, the
example-inverse weighting) are computed over the global batch (``global_batch.py``). The E-step is the exact
minimiser of J over q for the current decoder (``estep.py``): the decoder copies learn from the examples
assigned to them, the amortised posterior q is distilled to a, and the prior fits a through beta KL. w_i = 1,
except with a few labelled examples (``estep.labelled``): they carry a fixed share of the batch's fit
(``estep.labelled_weights``) however few they are. The anchor keeps every token within a margin of the base
model's loss (``terms.anchor_penalty``); at w_anchor = 0 it is measured, not added. A continuous latent's copies
are S draws from q, so sum_c q_ic R_ic is their mean (1/S) sum_c R_ic, q*'s prior term is log p - log q
(importance weights with q as the proposal), and KL(a || p) = sum_c a_c (log q_c + log(S a_c) - log p_c), q*'s
density at its draws.

Everything here is a pure function of tensors; the weightings are ``terms.WEIGHT_FUNCTIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokweight.training.config.components import EStepConfig, WeightingParams
from tokweight.training.objective.estep import (assigned_reconstruction, assignment, assignment_kl, distillation,
                                      labelled_weights, read_likelihood)
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch
from tokweight.training.objective.terms import (anchor_penalty, free_bits_kl, reconstruction_weights,
                                                weighted_reconstruction)
from tokweight.training.objective.schedules import StepSchedule
from tokweight.training.config.train import LossConfig


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
    R: torch.Tensor  # (B, copies) nats, the reconstruction under each copy
    degenerate: torch.Tensor  # (B,) bool: weights fell back to uniform
    beta: float
    estep: bool  # whether the E-step objective was the one optimised


def step_loss(latent, out, b: torch.Tensor, mask: torch.Tensor, loss: LossConfig, at: StepSchedule,
              params: WeightingParams, labels: torch.Tensor | None = None, batch: GlobalBatch = LOCAL,
              cluster: torch.Tensor | None = None) -> Terms:
    """J for one batch (the module's docstring): ``out`` the CVAE's outputs, b (B, T) nats over S (detached), mask
    (B, T); ``loss`` the run's ``LossConfig`` (weighting, free bits, anchor margin); ``at`` the step's schedule;
    labels (B,) strategy indices for an E-step that reads them; ``batch`` the global batch; ``cluster`` (B, K) the
    base's grouping's log pi for an E-step that weighs it in (``clusters.py``)."""
    pi, degenerate = reconstruction_weights(loss.weighting, b, mask, params,
                                            loss.token_weighted_reconstruction_weight, batch)  # (B, T)
    R = reconstruction(out, pi)  # (B, copies) nats: the step's one R
    head = out.post  # the amortised head's q, before any likelihood read
    if at.reads_likelihood:
        out = read_likelihood(out, R, at.estep, at.beta, cluster)
    obj = (em_objective(latent, out, R, at.beta, loss.free_bits, at.estep, labels, batch, head, cluster) if at.em
           else plain_objective(latent, out, R, at.beta, loss.free_bits, batch))
    anchor = anchored(latent, out, b, mask, loss.anchor_margin)
    total = obj.loss + at.anchor_weight * anchor if at.anchor_weight else obj.loss
    return Terms(obj, out, total, anchor, pi, R, degenerate, at.beta, at.em)


def reconstruction(out, pi: torch.Tensor) -> torch.Tensor:
    """R = sum_t pi_t l_t(c): (B, copies) nats from the outputs' NLL (B, copies, T) and pi (B, T)."""
    return weighted_reconstruction(out.nll, pi.to(out.nll.dtype))


def plain_objective(latent, out, R: torch.Tensor, beta: float, free_bits: float = 0.0,
                    batch: GlobalBatch = LOCAL) -> Objective:
    """J = mean_i E_q[R_i(z)] + beta * KL(q || p): the copies weighted by the amortised posterior; R (B, copies)
    nats (``reconstruction``)."""
    recon = latent.expectation(R, out.post).mean()
    kl = latent.kl(out.post, out.prior)
    kl_term = free_bits_kl(kl, free_bits, batch)
    return Objective(recon + beta * kl_term, recon, kl_term, kl)


def em_objective(latent, out, R: torch.Tensor, beta: float, free_bits: float, cfg: EStepConfig,
                 labels: torch.Tensor | None = None, batch: GlobalBatch = LOCAL,
                 head: torch.Tensor | None = None, cluster: torch.Tensor | None = None) -> Objective:
    """J_EM = mean_i [sum_c a_ic R_ic + CE(a_i, q_i)] + beta * KL(a || p), a = the E-step's assignment
    (detached): the decoder copies learn from a, the amortised posterior is distilled to a, and the prior fits a
    through beta * KL, which is J's own prior gradient at q = a. The posterior gets no KL gradient: a already
    holds beta. Reported: ``recon`` = E_q[R] and ``kl`` = KL(q || p), as in the plain objective.

    A continuous latent's copies are S draws z_s from q rather than every value, so a is the self-normalised
    importance weight of q*(z) = p(z|x) exp(-R(z) / beta) / Z with q as the proposal (reweighted wake-sleep,
    Bornschein & Bengio 2015): log p - log q enters where the discrete prior does, and the KL's gradient
    reaches the prior only. R (B, copies) nats (``reconstruction``); ``cfg`` the E-step as it acts at the step.
    """
    z = None if out.z is None else out.z.detach()  # each copy's value: q and p fit it, not move it
    log_p, log_q = latent.log_density(out.prior, z), latent.log_density(out.post, z)  # (B, copies) each
    log_target = log_p - log_q.detach() if latent.sampled else log_p  # the E-step's p, by the proposal
    a = assignment(R, log_target, cfg, beta, labels, batch, None if latent.sampled else head,
                   None if latent.sampled else cluster)  # (B, copies)
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
