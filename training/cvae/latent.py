"""The latent variable: posterior head, prior, how z is enumerated or sampled, KL.

Two latents with one interface, so the CVAE composes either:
- ``posterior(h)``: (B, d) pooled z-free hidden state -> posterior parameters
- ``prior(z_logits, z_hidden)``: at ``<z>``, the decoder's logits of the ``prior_tokens``
  (B, K) (None when ``prior_tokens`` is None) and its (B, d) hidden state -> prior parameters
- ``decoder_inputs(post, generator, global_batch)``: the latent values the decoder is run
  with, as (N, F) features and (N,) slot token ids (discrete) or None (continuous);
  N = B * copies
- ``expectation(R, post)``: (B, copies) reconstructions -> (B,) E_q[R]
- ``log_density(params, z)``: each copy's latent value under a posterior's or prior's parameters, (B, copies)
- ``kl(post, prior)``: (B,) or (B, D) nats

``sampled`` says whether the copies are draws from the posterior (continuous) or enumerate every value
(discrete): the E-step (``estep.py``) then corrects its weights by the proposal.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tokweight.training.objective.global_batch import LOCAL, GlobalBatch
from tokweight.training.objective.terms import categorical_kl, gaussian_kl, gaussian_log_density


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is in a lower precision (a bfloat16 autocast's head outputs): the posterior, the
    prior and their KL stay in full precision; float64 stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))

class CategoricalLatent(nn.Module):
    """K values, summed over exactly (no sampling): every example runs K decoder copies.

    Prior p(k|x): softmax over the decoder's logits of ``<z_0..z_{K-1}>`` at ``<z>`` (the
    next-token distribution renormalised over the K latent tokens, so their logits suffice).
    Posterior q(k|x,y): a linear head on the pooled z-free hidden state (with ``CVAEConfig.posterior_likelihood``,
    read with y's likelihood under each value where the E-step is sure: ``estep.read_likelihood``).
    """

    kind = "discrete"
    sampled = False

    def __init__(self, k: int, d_model: int, latent_ids: list[int]):
        super().__init__()
        if len(latent_ids) != k:
            raise ValueError(f"need {k} latent token ids, got {len(latent_ids)}")
        self.k = k
        self.features = k  # one-hot
        self.head = nn.Linear(d_model, k)
        self.register_buffer("latent_ids", torch.tensor(latent_ids), persistent=False)

    @property
    def copies(self) -> int:
        return self.k

    def posterior(self, h: torch.Tensor) -> torch.Tensor:
        """(B, K) log q from the pooled states h (B, d)."""
        return F.log_softmax(at_least_float32(self.head(h)), -1)

    @property
    def prior_tokens(self) -> torch.Tensor:
        return self.latent_ids  # (K,) the tokens whose logits at <z> the prior reads

    def prior(self, z_logits: torch.Tensor, z_hidden: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(at_least_float32(z_logits), -1)  # (B, K) log p

    def decoder_inputs(self, log_q: torch.Tensor, generator=None,
                       global_batch: GlobalBatch = LOCAL) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy i*K + k of example i carries value k: (B*K, K) one-hot and (B*K,) token ids, whatever ``log_q`` says
        (``every_value``)."""
        return self.every_value(log_q.shape[0], log_q.device)

    def every_value(self, B: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Every value for each of B examples, copy i*K + k carrying value k: (B*K, K) one-hot, (B*K,) token ids."""
        onehot = torch.eye(self.k, device=device, dtype=self.head.weight.dtype).repeat(B, 1)
        return onehot, self.latent_ids.repeat(B)

    def expectation(self, R: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
        return (log_q.exp() * R).sum(-1)  # (B,) sum_k q(k) R(k)

    def log_density(self, log_probs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return log_probs  # (B, K): copy k carries value k

    def kl(self, log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
        return categorical_kl(log_q, log_p)  # (B,)


class GaussianLatent(nn.Module):
    """z in R^D, ``samples`` reparameterised draws per example (each a decoder copy); N(0, I) or a
    learned conditional prior.

    The learned prior p(z|x) is a head on the decoder's hidden state at ``<z>``, which
    has seen x only.
    """

    kind = "continuous"
    sampled = True
    prior_tokens = None  # the prior reads the hidden state at <z>, no logits

    def __init__(self, z_dim: int, d_model: int, prior: str = "learned", samples: int = 1):
        super().__init__()
        if prior not in ("learned", "standard"):
            raise ValueError(f"prior must be 'learned' or 'standard', got {prior!r}")
        if samples < 1:
            raise ValueError(f"need samples >= 1, got {samples}")
        self.copies = samples
        self.features = z_dim
        self.head = nn.Linear(d_model, 2 * z_dim)
        self.prior_head = nn.Linear(d_model, 2 * z_dim) if prior == "learned" else None
        for lin in filter(None, (self.head, self.prior_head)):  # start near N(0, I)
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)

    def posterior(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, logvar = at_least_float32(self.head(h)).chunk(2, -1)
        return mu, logvar  # (B, D) each

    def prior(self, z_logits: None, z_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prior_head is None:
            zeros = z_hidden.new_zeros(z_hidden.shape[0], self.features, dtype=at_least_float32(z_hidden).dtype)
            return zeros, zeros
        mu, logvar = at_least_float32(self.prior_head(z_hidden)).chunk(2, -1)
        return mu, logvar

    def decoder_inputs(self, post, generator=None, global_batch: GlobalBatch = LOCAL) -> tuple[torch.Tensor, None]:
        """Copy i*S + s of example i carries its draw s: (B*S, D) reparameterised samples."""
        mu, logvar = post
        B, D = mu.shape
        shape = (global_batch.world * B, self.copies, D)  # drawn for the global batch, then our rows
        noise = global_batch.rows(torch.randn(shape, generator=generator, dtype=mu.dtype, device="cpu")).to(mu.device)
        return (mu[:, None] + (0.5 * logvar[:, None]).exp() * noise).view(B * self.copies, D), None

    def mean_inputs(self, post) -> tuple[torch.Tensor, None]:
        """One copy per example at the posterior's mean: (B, D)."""
        return post[0], None

    def expectation(self, R: torch.Tensor, post) -> torch.Tensor:
        return R.mean(-1)  # (B,) a Monte-Carlo estimate of E_q[R] over the samples

    def log_density(self, params, z: torch.Tensor) -> torch.Tensor:
        mu, logvar = params  # (B, D) each; z (B*S, D) from decoder_inputs
        return gaussian_log_density(z.view(mu.shape[0], self.copies, -1), mu[:, None], logvar[:, None])  # (B, S)

    def kl(self, post, prior) -> torch.Tensor:
        return gaussian_kl(*post, *prior)  # (B, D)
