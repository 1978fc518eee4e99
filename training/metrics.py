"""Training and evaluation metrics; each is defined by its formula in its docstring.

Evaluation metrics are computed from per-example records (``EvalRecords``) that one
``all_gather`` combines across ranks; ``finalize`` turns them into numbers.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def posterior_gradient_norms(recon: torch.Tensor, beta_kl: torch.Tensor, params: list[torch.nn.Parameter]) -> dict:
    """The seed note's diagnostic on the posterior parameters xi:

    grad_recon = || d recon / d xi ||_2,   grad_kl = || d (beta * KL term) / d xi ||_2,
    ratio = grad_recon / grad_kl. Both graphs are kept for the backward pass that follows.
    """
    def norm(value):
        if not value.requires_grad:
            return 0.0
        grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        return math.sqrt(sum(float(g.pow(2).sum()) for g in grads if g is not None))

    g_recon, g_kl = norm(recon), norm(beta_kl)
    return {"grad_recon": g_recon, "grad_kl": g_kl, "grad_ratio": g_recon / g_kl if g_kl > 0 else float("inf")}


# ---------------------------------------------------------------- evaluation over a split


def entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """H(p) = -sum_k p_k log p_k, nats (0 log 0 = 0)."""
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis)


def exact_mi(q: np.ndarray) -> float:
    """I(z; x,y) over the eval set = H(mean_i q_i) - mean_i H(q_i), nats; q (N, K)."""
    return float(entropy(q.mean(0)) - entropy(q).mean())


def strategy_mi(q: np.ndarray, labels: list) -> float:
    """I(z; s) = H(mean_i q_i) - sum_s p(s) H(mean_{i: s_i = s} q_i), nats: the part of the posterior's
    information that is about the ground-truth strategy s (<= log S; <= the exact I(z; x,y) when s
    is a function of (x, y)). Unlike I(z; x,y) it does not count codes of x or of y's other tokens."""
    labels = np.asarray(labels, dtype=object)
    per_label = sum((labels == s).mean() * entropy(q[labels == s].mean(0)) for s in set(labels.tolist()))
    return float(entropy(q.mean(0)) - per_label)


def usage(q: np.ndarray) -> dict:
    """Aggregate posterior qbar = mean_i q_i (K,); perplexity = exp(H(qbar)), in [1, K]."""
    qbar = q.mean(0)
    return {"usage": qbar.tolist(), "usage_perplexity": float(np.exp(entropy(qbar)))}


def active_units(mu: np.ndarray, threshold: float = 0.01) -> int:
    """Dimensions d with Cov_i(mu_{i,d}) > threshold (Burda et al.), mu (N, D) posterior means."""
    return int((mu.var(0) > threshold).sum()) if len(mu) > 1 else 0


def contingency(labels: list, clusters: np.ndarray) -> tuple[np.ndarray, list]:
    """(C, S) counts of cluster c against ground-truth label s, and the label names."""
    names = sorted(set(labels))
    table = np.zeros((int(clusters.max()) + 1 if len(clusters) else 0, len(names)))
    for lab, c in zip(labels, clusters):
        table[c, names.index(lab)] += 1
    return table, names


def nmi(table: np.ndarray) -> float:
    """NMI = 2 I(C; S) / (H(C) + H(S)) from a (C, S) count table (arithmetic normalisation)."""
    p = table / table.sum()
    pc, ps = p.sum(1), p.sum(0)
    nz = p > 0
    mi = float((p[nz] * np.log(p[nz] / np.outer(pc, ps)[nz])).sum())
    denom = float(entropy(pc) + entropy(ps))
    return 2 * mi / denom if denom > 0 else 0.0


def hungarian_accuracy(table: np.ndarray) -> float:
    """max over one-to-one maps cluster -> label of (matched counts) / N (scipy's assignment)."""
    from scipy.optimize import linear_sum_assignment

    if table.sum() == 0:
        return 0.0
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / table.sum())


def kmeans(x: np.ndarray, k: int, seed: int = 0, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means, k-means++ start with a seeded rng: (centres (k, D), assignment (N,))."""
    rng = np.random.default_rng(seed)
    centres = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d2 = np.min([((x - c) ** 2).sum(1) for c in centres], 0)
        centres.append(x[rng.choice(len(x), p=d2 / d2.sum())] if d2.sum() > 0 else x[rng.integers(len(x))])
    centres = np.array(centres)
    for _ in range(iters):
        assign = ((x[:, None] - centres[None]) ** 2).sum(-1).argmin(1)
        new = np.array([x[assign == j].mean(0) if (assign == j).any() else centres[j] for j in range(k)])
        if np.allclose(new, centres):
            break
        centres = new
    return centres, assign


class EvalRecords:
    """Per-example records of an eval pass; ``merge`` combines ranks' records, ``finalize`` the metrics."""

    def __init__(self):
        self.rows: dict[str, list] = {k: [] for k in ("recon", "recon_uniform", "kl", "post", "strategy", "degenerate")}

    def add(self, recon, recon_uniform, kl, post, strategies, degenerate) -> None:
        """recon, recon_uniform, kl: (B,); post: (B, K) q or (B, D) mu; strategies: labels or None."""
        for name, value in (("recon", recon), ("recon_uniform", recon_uniform), ("kl", kl), ("post", post),
                            ("degenerate", degenerate)):
            self.rows[name].extend(value.detach().cpu().double().numpy())
        self.rows["strategy"].extend(strategies)

    def merge(self, others: list["EvalRecords"]) -> "EvalRecords":
        for other in others:
            for k in self.rows:
                self.rows[k].extend(other.rows[k])
        return self

    def finalize(self, latent: str, k: int, seed: int = 0) -> dict:
        """Means of recon (weighted), recon_uniform and KL; discrete: exact MI, usage, strategy MI; continuous:
        active units; both: strategy NMI and Hungarian accuracy of argmax q (or of k-means
        clusters of mu, K clusters) against the ground-truth strategy."""
        n = len(self.rows["recon"])
        if n == 0:
            return {"examples": 0}
        out = {"examples": n, **{m: float(np.mean(self.rows[m])) for m in ("recon", "recon_uniform", "kl")},
               "degenerate": int(np.sum(self.rows["degenerate"]))}
        post = np.stack(self.rows["post"])
        if latent == "discrete":
            out |= {"mi": exact_mi(post), **usage(post)}
            clusters = post.argmax(1)
        else:
            out["active_units"] = active_units(post)
            clusters = kmeans(post, k, seed)[1]
        known = [i for i, s in enumerate(self.rows["strategy"]) if s is not None]
        if known:
            labels = [self.rows["strategy"][i] for i in known]
            table, _ = contingency(labels, clusters[known])
            out |= {"strategy_nmi": nmi(table), "strategy_accuracy": hungarian_accuracy(table)}
            if latent == "discrete":
                out["strategy_mi"] = strategy_mi(post[known], labels)
        return out
