"""The base's own grouping of the lines, as a cost in the E-step (``EStepConfig.cluster_weight``).

Where strategies write different things, the mean of a base's states that predict S already groups the lines by the
strategy that wrote them (``scripts/cluster_probe.py``; ``docs/task-kinds.md``). The decoders' own assignment does
not: a value's decoder ranks the symbols at the token where the strategies part, and can bind the value to one
strategy on some inputs and to another on the rest (a per-input selector) at the same objective as a code. The
base's grouping does not learn from the decoders, so it can tell the two apart.

k-means of the standardised pooled states over a sample of the training lines gives K centres c_k; an example's

    log pi(k) = log_softmax_k(-|h - c_k|^2 / (2 v))

with h its standardised z-free pooled state (what the posterior head reads) and v the sample's mean squared
distance to its own centre, tilts the E-step in nats of R: q*(k) ∝ p(k|x) exp(-(R(k) - gamma log pi(k)) / beta), so
the tilt holds while beta warms up from 0, when the decoders' first preferences set the code; as a log prior it
would be nothing against R / beta then. Value k starts as cluster k. Where the states hold no grouping (a read
order's), the centres lie close against the spread v and the tilt is small.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from tokweight.training.evaluation.metrics import best_kmeans

CLUSTER_LINES = 2048
"""How many training lines (the split's first, in its shards' order) the centres are fitted on."""

KMEANS_STARTS = 10
"""k-means++ starts (seeds 0..9); the lowest inertia is kept."""


@dataclass(frozen=True)
class Clusters:
    """K centres in the standardised space of the pooled states, and how to read an example against them."""

    mean: torch.Tensor  # (d,) of the fitted sample's pooled states
    scale: torch.Tensor  # (d,) their standard deviation
    centres: torch.Tensor  # (K, d) standardised
    spread: float  # v: the sample's mean squared distance to its own centre, standardised

    @classmethod
    def fit(cls, pooled: torch.Tensor, k: int) -> Clusters:
        """Centres of ``pooled`` (N, d) states by k-means with ``k`` clusters (``KMEANS_STARTS`` seeded starts,
        the lowest inertia kept), on the CPU in float64: the same centres on every device and rank."""
        x = pooled.detach().double().cpu()
        if len(x) < k:
            raise ValueError(f"estep cluster_weight: fitting {k} clusters needs at least {k} training lines, the "
                             f"split has {len(x)}")
        mean, scale = x.mean(0), x.std(0) + 1e-6
        X = ((x - mean) / scale).numpy()
        centres, assigned = best_kmeans(X, k, KMEANS_STARTS)
        spread = float(((X - centres[assigned]) ** 2).sum(1).mean())
        return cls(mean.float(), scale.float(), torch.from_numpy(np.asarray(centres)).float(), max(spread, 1e-6))

    def to(self, device: torch.device) -> Clusters:
        return replace(self, mean=self.mean.to(device), scale=self.scale.to(device), centres=self.centres.to(device))

    def log_prob(self, pooled: torch.Tensor) -> torch.Tensor:
        """log pi(k) (B, K) in float32 for pooled states (B, d), on their device; detached."""
        h = (pooled.detach().float() - self.mean) / self.scale  # (B, d)
        d2 = ((h[:, None] - self.centres[None]) ** 2).sum(-1)  # (B, K)
        return F.log_softmax(-d2 / (2 * self.spread), -1)
