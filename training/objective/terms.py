"""Reconstruction weightings and the CVAE loss terms (docs/contract.md §3), as pure functions of tensors.

Every weighting turns the stop-gradient baseline surprisal ``b`` (B, T) nats over S and
the S mask into per-token weights ``pi`` (B, T) with ``R(z) = sum_t pi_t l_t(z)``: the
weighted mean of each example is formed as one weighted sum over one weight sum, inside
``pi``, and nowhere else. A batch averages R over examples.

| weighting            | pi_t                                                      |
|----------------------|-----------------------------------------------------------|
| uniform              | 1 / T                                                     |
| sum                  | 1                                                         |
| surprisal-share      | w_t / (sum_s w_s + eps),  w_t = b_t                       |
| inverse-surprisal    | w_t / (sum_s w_s + eps),  w_t = 1 / (b_t + eps_inv)       |
| example-inverse      | v_i / T,  v_i = 1/(mean_t b_t + eps), batch mean of v = 1 |
| distribution-rescale | 1 / (T * B_data),  B_data = dataset mean of mean_t b_t    |
| excess-share         | w_t / (sum_s w_s + eps),  w_t = relu(b_t - median_S b)    |

Mixing: ``pi = (1 - lam) * pi_uniform + lam * pi_weighting``. For the weightings that
read an example's own b, an example with ``sum_t b_t < eps`` is degenerate: it gets
``pi_uniform`` and is counted.

Every weighting takes the step's ``GlobalBatch`` (``global_batch.py``); only
example-inverse reads it, to normalise v over the global batch rather than this rank's rows.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from tokweight.training.config.components import WEIGHTINGS, WeightingParams
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch


def _normalised(w: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, T) weights, 0 where masked -> one weighted-mean denominator per example."""
    return w / (w.sum(-1, keepdim=True) + eps)


def uniform_weights(b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                    batch: GlobalBatch = LOCAL) -> torch.Tensor:
    m = mask.to(b.dtype)
    return m / m.sum(-1, keepdim=True).clamp_min(1.0)


def sum_weights(b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                batch: GlobalBatch = LOCAL) -> torch.Tensor:
    return mask.to(b.dtype)


def surprisal_share_weights(b: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """pi_t = sg(b_t) / (sum_s sg(b_s) + eps) over S: (B, T), 0 where masked."""
    return _normalised(b.detach() * mask, eps)


def excess_share_weights(b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                         batch: GlobalBatch = LOCAL) -> torch.Tensor:
    """The share of each token's surprisal above the example's median over S: (B, T), 0 where masked.

    Why: an imperfect base model leaves a floor of surprisal on every token after t0 (its residual
    error, which z cannot remove), and with T tokens after t0 that floor takes a share T times a
    token's from the few tokens where the strategy is decided. The median of an example's b is that
    floor when most of its tokens are strategy-free; subtracting it gives the decision its share back.
    An example with no token above its median (flat b) keeps surprisal-share's weights, which are
    then near uniform. The median of an even count is the lower of the middle two (``nanmedian``).
    """
    b = b.detach()
    floor = b.masked_fill(~mask, float("nan")).nanmedian(-1, keepdim=True).values
    excess = torch.relu(b - floor) * mask
    flat = excess.sum(-1, keepdim=True) < params.eps
    return torch.where(flat, surprisal_share_weights(b, mask, params.eps), _normalised(excess, params.eps))


def inverse_surprisal_weights(b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                              batch: GlobalBatch = LOCAL) -> torch.Tensor:
    return _normalised(mask / (b.detach().clamp_min(0.0) + params.eps_inv), params.eps)


def example_mean_b(b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean_t b_t over S, nats."""
    return (b.detach() * mask).sum(-1) / mask.sum(-1).clamp_min(1)


def example_inverse_weights(b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                            batch: GlobalBatch = LOCAL) -> torch.Tensor:
    """uniform * v_i; v normalised to mean 1 over the global batch's non-degenerate examples.

    The normalisation makes this weighting depend on the batch it is computed on: the
    mean is the global batch's (``batch``), however many ranks share it.
    """
    v = 1.0 / (example_mean_b(b, mask) + params.eps)  # (B,)
    v_mean = batch.masked_mean(v, ~degenerate_examples(b, mask, params.eps))
    v = torch.where(torch.isfinite(v_mean), v / v_mean, 1.0)  # nan: no example has a share (chosen on the device)
    return uniform_weights(b, mask, params) * v[:, None]


def distribution_rescale_weights(b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                                 batch: GlobalBatch = LOCAL) -> torch.Tensor:
    if params.dataset_mean_b is None:
        raise ValueError("distribution-rescale needs dataset_mean_b (the store's mean of mean_t b_t)")
    return uniform_weights(b, mask, params) / params.dataset_mean_b


WEIGHT_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "uniform": uniform_weights,
    "sum": sum_weights,
    "surprisal-share": lambda b, mask, params, batch=LOCAL: surprisal_share_weights(b, mask, params.eps),
    "inverse-surprisal": inverse_surprisal_weights,
    "example-inverse": example_inverse_weights,
    "distribution-rescale": distribution_rescale_weights,
    "excess-share": excess_share_weights,
}
"""The weights of each weighting ``components.WEIGHTINGS`` names: (b, mask, params, batch) -> pi (B, T)."""


def degenerate_examples(b: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(B,) bool: sum_t b_t < eps, so b carries no within-example share."""
    return (b.detach() * mask).sum(-1) < eps


def reconstruction_weights(name: str, b: torch.Tensor, mask: torch.Tensor, params: WeightingParams,
                           lam: float = 1.0, batch: GlobalBatch = LOCAL) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi (B, T), degenerate (B,) bool): the mixed weights of docs/contract.md §3 and the fallback rows.

    b: (B, T) nats over S (detached here); mask: (B, T) bool; batch: the step's global batch.
    """
    if name not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {name!r}; expected one of {sorted(WEIGHTINGS)}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"the mixing weight must be in [0, 1], got {lam}")
    weighting = WEIGHTINGS[name]
    b = b.detach() if b.is_floating_point() else b.detach().float()
    uniform = uniform_weights(b, mask, params)
    pi = (1.0 - lam) * uniform + lam * WEIGHT_FUNCTIONS[name](b, mask, params, batch)
    if not weighting.per_example:
        return pi, torch.zeros(b.shape[0], dtype=torch.bool, device=b.device)
    degenerate = degenerate_examples(b, mask, params.eps)
    return torch.where(degenerate[:, None], uniform, pi), degenerate


def weighted_reconstruction(nll: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """R = sum_t pi_t l_t: nll (B, ..., T) nats over S, pi (B, T) -> (B, ...)."""
    pi = pi.reshape(pi.shape[0], *([1] * (nll.dim() - 2)), pi.shape[-1])
    return (nll * pi).sum(-1)


def anchor_penalty(nll: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, margin: float) -> torch.Tensor:
    """mean_t relu(l_t(z) - b_t - margin) over S: how far each copy's tokens rise above the base model's.

    nll (B, copies, T) nats over S (0 where masked), b (B, T) the stop-gradient base surprisal, mask
    (B, T) -> (B, copies) nats. Why: a weighting that gives a token no weight (surprisal-share where
    b_t = 0) leaves it free to drift; this pulls a token back only once it is worse than the base by
    more than ``margin``, so it does not fight z where z makes a token better than the base.
    """
    m = mask.to(nll.dtype)[:, None]  # (B, 1, T)
    excess = torch.relu(nll - b.detach().to(nll.dtype)[:, None] - margin) * m
    return excess.sum(-1) / m.sum(-1).clamp_min(1.0)


# ---------------------------------------------------------------- KL terms


def categorical_kl(log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """KL(q || p) = sum_k q_k (log q_k - log p_k): (B, K) log-probabilities -> (B,) nats."""
    return (log_q.exp() * (log_q - log_p)).sum(-1)


def gaussian_kl(mu_q: torch.Tensor, logvar_q: torch.Tensor, mu_p: torch.Tensor,
                logvar_p: torch.Tensor) -> torch.Tensor:
    """KL(N(mu_q, var_q) || N(mu_p, var_p)) per dimension: (B, D) -> (B, D) nats.

    = 0.5 * (logvar_p - logvar_q + (var_q + (mu_q - mu_p)^2) / var_p - 1)
    """
    return 0.5 * (logvar_p - logvar_q + (logvar_q.exp() + (mu_q - mu_p) ** 2) / logvar_p.exp() - 1.0)


def gaussian_log_density(z: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """log N(z; mu, diag(exp(logvar))) summed over the last dimension: broadcastable (..., D) -> (...) nats."""
    return -0.5 * (((z - mu) ** 2) / logvar.exp() + logvar + math.log(2 * math.pi)).sum(-1)


def example_kl(kl: torch.Tensor) -> torch.Tensor:
    """An example's whole KL: (B,) categorical or (B, D) per Gaussian dimension -> (B,) nats."""
    return kl.sum(-1) if kl.dim() > 1 else kl


def free_bits_kl(kl: torch.Tensor, free_bits: float, batch: GlobalBatch = LOCAL) -> torch.Tensor:
    """The KL term with free bits: sum over dimensions of max(lambda, batch-mean KL_d).

    kl: (B,) for one categorical latent, or (B, D) per Gaussian dimension. lambda = 0 is
    the plain batch mean. The mean is the global batch's (``batch``), taken before the
    floor: the term is not additive over ranks or micro-batches when lambda > 0.
    """
    per_dim = batch.mean(kl)
    return per_dim.clamp_min(free_bits).sum() if free_bits > 0 else per_dim.sum()
