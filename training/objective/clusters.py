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
would be nothing against R / beta then. Value k starts as cluster k (``estep.cluster_map`` "identity").

Under ``estep.cluster_map`` "agreement" no value is any cluster to begin with: ``Agreement`` keeps the joint of
the base's cluster and the decoders' own choice (argmin R) over recent steps, and an example's tilt is

    log sum_c pi(c) P(k | c) / P(k)

the pointwise mutual information of value k with the example's cluster, as far as the decoders already agree
with the grouping. Where the clusters and the decoders' choices are independent (a read order's lines, grouped
by what x holds; a collapsed z, whose choices tie) every value's tilt is 0; where the decoders bind most of a
cluster to one value, the tilt carries the rest of it there. Under "matched" each value is given one cluster (the
pairs the decoders agree on most, one to one) and its tilt is log pi of that cluster, as under "identity", weighed
by how far the decoders follow the grouping (I(cluster; value) / log K of the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from tokweight.training.evaluation.metrics import best_kmeans
from tokweight.training.objective.estep import one_hot
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch

CLUSTER_LINES = 2048
"""How many training lines (the split's first, in its shards' order) the centres are fitted on."""

KMEANS_STARTS = 10
"""k-means++ starts (seeds 0..9); the lowest inertia is kept."""

AGREEMENT_DECAY = 0.99
"""``Agreement``'s running joint: each step's global batch enters with weight 1 - decay (about the last hundred
steps); it starts independent (uniform), so no value has a tilt at step 0."""


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

    def to_json(self) -> dict:
        """What a checkpoint keeps (float32 values, exact through JSON), so a resumed run reads the centres it was
        fitted with instead of refitting on trained weights."""
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(), "centres": self.centres.tolist(),
                "spread": self.spread}

    @classmethod
    def from_json(cls, saved: dict) -> Clusters:
        return cls(*(torch.tensor(saved[key], dtype=torch.float32) for key in ("mean", "scale", "centres")),
                   float(saved["spread"]))

    def log_prob(self, pooled: torch.Tensor) -> torch.Tensor:
        """log pi(k) (B, K) in float32 for pooled states (B, d), on their device; detached."""
        h = (pooled.detach().float() - self.mean) / self.scale  # (B, d)
        d2 = ((h[:, None] - self.centres[None]) ** 2).sum(-1)  # (B, K)
        return F.log_softmax(-d2 / (2 * self.spread), -1)


@dataclass
class Agreement:
    """The running joint of an example's base cluster c and its decoders' choice k (argmin R), K x K on the run's
    device, and how it maps a cluster to values (``estep.cluster_map``: "agreement" or "matched"); every rank holds
    the same table (each step's is averaged over the ranks), and a checkpoint keeps it (``to_json``), so a resumed
    run goes on with the table it had."""

    joint: torch.Tensor  # (K, K) P(c, k), summing to 1
    map: str  # "agreement" or "matched"
    decay: float = AGREEMENT_DECAY

    @classmethod
    def start(cls, k: int, device: torch.device, map: str, saved: list | None = None) -> Agreement:
        """Independent (uniform) clusters and values, or a checkpoint's table (``saved``)."""
        joint = torch.full((k, k), 1.0 / k ** 2) if saved is None else torch.tensor(saved, dtype=torch.float32)
        return cls(joint.to(device), map)

    def tilt(self, log_pi: torch.Tensor) -> torch.Tensor:
        """(B, K) the E-step's tilt of each value for log pi (B, C), under this table's map; detached."""
        return self.pointwise(log_pi) if self.map == "agreement" else self.matched(log_pi)

    def log_ratio(self) -> torch.Tensor:
        """(C, K) log P(k | c) / P(k): the pointwise mutual information of cluster c and value k."""
        return pointwise_mi(self.joint)

    def pointwise(self, log_pi: torch.Tensor) -> torch.Tensor:
        """"agreement": (B, K) log sum_c pi(c) P(k | c) / P(k); 0 for every value where they are independent."""
        return torch.logsumexp(log_pi.detach()[:, :, None] + self.log_ratio()[None], dim=1)

    def matched(self, log_pi: torch.Tensor) -> torch.Tensor:
        """"matched": (B, K) g log pi(m(k)), value k's tilt the example's log pi of the cluster m(k) matched to it
        one to one (greedily, the highest pointwise mutual information first), weighed by g = I(cluster; value) /
        log K of the table, so a grouping the decoders do not follow tilts nearly nothing and one they mostly
        follow carries the rest of each cluster to its value. On the device, without reading anything back."""
        ratio, k = self.log_ratio(), self.joint.shape[1]
        gate = (self.joint * ratio).sum() / math.log(k)
        return gate * log_pi.detach().index_select(1, one_to_one(ratio))  # value k's cluster's log pi

    @torch.no_grad()
    def update(self, log_pi: torch.Tensor, R: torch.Tensor, batch: GlobalBatch = LOCAL) -> None:
        """Fold in a step's examples: pi (B, C) against the one-hot of argmin R (B, K), averaged over the global
        batch, in place and on the device."""
        choice = one_hot(R.argmin(-1), R.shape[-1], torch.float32)  # (B, K)
        table = batch.average(log_pi.float().exp().T @ choice / len(R))  # (C, K)
        self.joint.mul_(self.decay).add_(table, alpha=1 - self.decay)

    def to_json(self) -> list:
        return self.joint.tolist()


def pointwise_mi(joint: torch.Tensor) -> torch.Tensor:
    """(R, C) log P(r, c) / (P(r) P(c)) of a joint (R, C) summing to 1, its entries floored at the dtype's smallest
    normal number: a pair the running table has not seen for thousands of steps decays below it, and a value no
    line chooses would leave a column of zeros, whose 0 / 0 would be NaN and win every argmax."""
    joint = joint.clamp(min=torch.finfo(joint.dtype).tiny)
    return joint.log() - joint.sum(1, keepdim=True).log() - joint.sum(0, keepdim=True).log()


def one_to_one(score: torch.Tensor) -> torch.Tensor:
    """(C,) the row paired with each column of ``score`` (R, C), R >= C: greedily, the highest score first, each row
    and column once (on ties the first in row-major order, so an all-equal score pairs column c with row c). On the
    device, without reading anything back."""
    rows, cols = score.shape
    columns = torch.arange(cols, device=score.device)
    match, left = torch.zeros_like(columns), score
    for _ in range(cols):
        flat = left.argmax()
        r, c = flat // cols, flat % cols
        match = torch.where(columns == c, r, match)
        left = left.index_fill(0, r.view(1), -math.inf).index_fill(1, c.view(1), -math.inf)
    return match
