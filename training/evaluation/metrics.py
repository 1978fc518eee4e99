"""Training and evaluation metrics; each is defined by its formula in its docstring.

Evaluation metrics are computed from per-example records (``EvalRecords``) that one
``all_gather`` combines across ranks; ``finalize`` turns them into numbers.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def posterior_gradient_norms(recon: torch.Tensor, beta_kl: torch.Tensor, params: list[torch.nn.Parameter],
                             average=lambda g: g) -> dict:
    """The dilution argument's diagnostic on the posterior parameters xi:

    grad_recon = || d recon / d xi ||_2,   grad_kl = || d (beta * KL term) / d xi ||_2,
    ratio = grad_recon / grad_kl. Both graphs are kept for the backward pass that follows. ``average``: a
    gradient averaged over the ranks (``GlobalBatch.average``), so that the norms are the global batch's.
    """
    def norm(value):
        if not value.requires_grad:
            return 0.0
        grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
        return math.sqrt(sum(float(average(g).pow(2).sum()) for g in grads if g is not None))

    g_recon, g_kl = norm(recon), norm(beta_kl)
    return {"grad_recon": g_recon, "grad_kl": g_kl, "grad_ratio": g_recon / g_kl if g_kl > 0 else float("inf")}


# ---------------------------------------------------------------- evaluation over a split


def informative_token_spread(nll: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) max_k l_t*(k) - min_k l_t*(k) at t* = argmax_t b_t, the example's most surprising token (its t0
    on the synthetic tasks): how much the decoder's prediction there responds to z. nll (B, copies, T)
    nats over S, b (B, T), mask (B, T) bool."""
    t_star = b.detach().masked_fill(~mask, -math.inf).argmax(-1)  # (B,)
    at = nll.gather(2, t_star[:, None, None].expand(-1, nll.shape[1], 1))[..., 0]  # (B, copies)
    return at.max(1).values - at.min(1).values


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


# The floors below which the posterior is called flat (it carries no information about x, y), and
# with it the strategy NMI / accuracy uninformative: argmax q or k-means of mu then sorts examples
# by noise, and a near-uniform contingency can still score well, even perfectly.
MI_FLOOR = 0.01
"""nats: discrete exact MI, continuous MI estimate."""
ACTIVE_UNIT_THRESHOLD = 0.01
"""Var_i mu_{i,d} above which dimension d is active (Burda et al.)."""
POSTERIOR_RULES = {
    "discrete": f"exact MI >= {MI_FLOOR} nats",
    "continuous": f">= 1 active unit (Var_i mu_i,d > {ACTIVE_UNIT_THRESHOLD}) and MI estimate >= {MI_FLOOR} nats "
                  "and > 2 SE",
}


def active_units(mu: np.ndarray, threshold: float = ACTIVE_UNIT_THRESHOLD) -> int:
    """Dimensions d with Cov_i(mu_{i,d}) > threshold (Burda et al.), mu (N, D) posterior means."""
    return int((mu.var(0) > threshold).sum()) if len(mu) > 1 else 0


def contingency(labels: list, clusters: np.ndarray, n_clusters: int | None = None) -> tuple[np.ndarray, list]:
    """(C, S) counts of cluster c against ground-truth label s, and the label names; C = n_clusters
    (default: the largest cluster seen + 1)."""
    names = sorted(set(labels))
    if n_clusters is None:
        n_clusters = int(clusters.max()) + 1 if len(clusters) else 0
    table = np.zeros((n_clusters, len(names)))
    for lab, c in zip(labels, clusters):
        table[c, names.index(lab)] += 1
    return table, names


def contingency_mi(counts: np.ndarray) -> float:
    """I(a; b) = H(b) - sum_a p(a) H(b | a), nats, of a (A, B) table of counts (rows without counts drop out)."""
    counts = counts[counts.sum(1) > 0]
    if not counts.size:
        return 0.0
    p_a = counts.sum(1) / counts.sum()
    mi = entropy(counts.sum(0) / counts.sum()) - (p_a * entropy(counts / counts.sum(1, keepdims=True))).sum()
    return max(0.0, float(mi))  # >= 0; rounding can leave -0.0


def nmi(table: np.ndarray) -> float:
    """NMI = 2 I(C; S) / (H(C) + H(S)) from a (C, S) count table (arithmetic normalisation)."""
    p = table / table.sum()
    denom = float(entropy(p.sum(1)) + entropy(p.sum(0)))
    return 2 * contingency_mi(table) / denom if denom > 0 else 0.0


def hungarian_accuracy(table: np.ndarray) -> float:
    """max over one-to-one maps cluster -> label of (matched counts) / N (scipy's assignment)."""
    from scipy.optimize import linear_sum_assignment

    if table.sum() == 0:
        return 0.0
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / table.sum())


def matched_labels(table: np.ndarray, names: list) -> dict:
    """label -> cluster under the one-to-one map of ``hungarian_accuracy`` (labels beyond C clusters: unmatched)."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-table)
    return {names[c]: int(r) for r, c in zip(rows, cols)}


def gaussian_log_density(z: np.ndarray, mu: np.ndarray, logvar: np.ndarray) -> np.ndarray:
    """log N(z_a; mu_b, diag exp(logvar_b)) for every pair: z (A, D), mu and logvar (B, D) -> (A, B) nats."""
    sq = (z[:, None] - mu[None]) ** 2 / np.exp(logvar)[None]  # (A, B, D)
    return -0.5 * (sq + logvar[None] + math.log(2 * math.pi)).sum(-1)


def gaussian_mi(mu: np.ndarray, logvar: np.ndarray, seed: int = 0, max_examples: int = 4096,
                chunk: int = 256) -> tuple[float, float]:
    """Monte Carlo I(z; x,y) = E_i E_{z ~ q_i} [log q_i(z) - log q_agg(z)], q_agg = mean_j q_j the split's
    aggregate posterior (Hoffman & Johnson 2016; He et al. 2019's MI), one seeded sample per example:
    (estimate, standard error over examples), nats. Both are 0 when every posterior is the same;
    the estimate is at most log N. Over a seeded subset of ``max_examples`` when the split is larger."""
    rng = np.random.default_rng(seed)
    if len(mu) > max_examples:
        keep = np.sort(rng.choice(len(mu), max_examples, replace=False))
        mu, logvar = mu[keep], logvar[keep]
    n = len(mu)
    if n < 2:
        return 0.0, 0.0
    z = mu + np.exp(0.5 * logvar) * rng.standard_normal(mu.shape)  # (N, D): z_i ~ q_i
    terms = np.concatenate([pointwise_mi(z[a:a + chunk], mu, logvar, a) for a in range(0, n, chunk)])
    return float(terms.mean()), float(terms.std(ddof=1) / math.sqrt(n))


def pointwise_mi(z: np.ndarray, mu: np.ndarray, logvar: np.ndarray, start: int) -> np.ndarray:
    """log q_i(z_i) - log mean_j q_j(z_i) for the examples i = start.. of the chunk z (A, D) -> (A,)."""
    from scipy.special import logsumexp

    log_q = gaussian_log_density(z, mu, logvar)  # (A, N): row a is z of example start + a
    own = log_q[np.arange(len(z)), start + np.arange(len(z))]
    return own - (logsumexp(log_q, axis=1) - math.log(len(mu)))


def posterior_informative(metrics: dict, latent: str) -> tuple[bool, str]:
    """(whether the posterior carries information by ``POSTERIOR_RULES[latent]``, the values it was read off)."""
    if latent == "discrete":
        mi = metrics["mi"]
        return mi >= MI_FLOOR, f"exact MI {mi:.4f} nats"
    units, mi, se = metrics["active_units"], metrics.get("mi_estimate"), metrics.get("mi_estimate_se")
    if mi is None:  # records without log-variances: active units alone
        return units >= 1, f"{units} active units"
    return units >= 1 and mi >= MI_FLOOR and mi > 2 * se, f"{units} active units, MI estimate {mi:.4f} ± {se:.4f} nats"


def latent_clusters(post: np.ndarray, latent: str, k: int, seed: int = 0) -> np.ndarray:
    """(N,) the latent value each example's posterior points to: argmax q, or its k-means cluster of mu (K clusters)."""
    return post.argmax(1) if latent == "discrete" else kmeans(post, k, seed)[1]


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


def best_kmeans(x: np.ndarray, k: int, starts: int) -> tuple[np.ndarray, np.ndarray]:
    """``kmeans`` from seeds 0 .. starts - 1, the run of lowest inertia (sum of squared distances to the centres)."""
    runs = [kmeans(x, k, seed) for seed in range(starts)]
    return min(runs, key=lambda run: float(((x - run[0][run[1]]) ** 2).sum()))


class EvalRecords:
    """Per-example records of an eval pass; ``merge`` combines ranks' records, ``finalize`` the metrics."""

    def __init__(self):
        self.rows: dict[str, list] = {k: [] for k in ("recon", "recon_uniform", "kl", "post", "logvar", "strategy",
                                                      "degenerate", "nll_matched", "nll_by_value", "b_sum", "tokens",
                                                      "key")}

    def add(self, recon, recon_uniform, kl, post, strategies, degenerate, logvar=None, *, nll_matched=None,
            nll_by_value=None, b_sum=None, tokens=None, keys=()) -> None:
        """recon, recon_uniform, kl: (B,); post: (B, K) q or (B, D) mu; strategies: labels or None;
        logvar: (B, D) of a continuous posterior (its MI estimate), or None; nll_matched (B,) nats: sum over S
        of l_t under the example's own latent value (argmax q; continuous: its posterior sample); nll_by_value
        (B, K) nats: the same under each latent value (discrete); b_sum (B,) nats: the base model's sum over S;
        tokens (B,): |S|; keys: the examples' keys."""
        for name, value in (("recon", recon), ("recon_uniform", recon_uniform), ("kl", kl), ("post", post),
                            ("degenerate", degenerate), ("logvar", logvar), ("nll_matched", nll_matched),
                            ("nll_by_value", nll_by_value), ("b_sum", b_sum), ("tokens", tokens)):
            if value is not None:
                self.rows[name].extend(value.detach().cpu().double().numpy())
        self.rows["strategy"].extend(strategies)
        self.rows["key"].extend(keys)

    def merge(self, others: list["EvalRecords"]) -> "EvalRecords":
        for other in others:
            for k in self.rows:
                self.rows[k].extend(other.rows[k])
        return self

    def finalize(self, latent: str, k: int, seed: int = 0) -> dict:
        """Means of recon (weighted), recon_uniform and KL; the token-mean NLL (discrete: also under each latent value,
        ``nll_by_value``); discrete: exact MI, usage, strategy MI; continuous:
        active units and the MI estimate (with its SE; when log-variances were recorded); both: whether the
        posterior is informative (``POSTERIOR_RULES``), strategy NMI and Hungarian accuracy of argmax q (or
        of k-means clusters of mu, K clusters) against the ground-truth strategy. The NMI and accuracy are
        numbers whatever the posterior; ``posterior_informative`` false says they mean nothing."""
        n = len(self.rows["recon"])
        if n == 0:
            return {"examples": 0}
        out = {"examples": n, **{m: float(np.mean(self.rows[m])) for m in ("recon", "recon_uniform", "kl")},
               "degenerate": int(np.sum(self.rows["degenerate"]))}
        if len(self.rows["tokens"]) == n:  # token means over every S token of the split (a sum over sums)
            tokens = float(np.sum(self.rows["tokens"]))
            out |= {"nll_token_mean": float(np.sum(self.rows["nll_matched"])) / tokens,
                    "base_nll_token_mean": float(np.sum(self.rows["b_sum"])) / tokens}
            if len(self.rows["nll_by_value"]) == n:  # discrete: the token-mean NLL under each latent value
                out["nll_by_value"] = (np.sum(self.rows["nll_by_value"], axis=0) / tokens).tolist()
        post = np.stack(self.rows["post"])
        out |= self.latent_metrics(post, latent, seed)
        informative, values = posterior_informative(out, latent)
        out |= {"posterior_informative": bool(informative), "posterior_values": values}
        return out | self.strategy_metrics(post, latent_clusters(post, latent, k, seed), latent)

    def latent_metrics(self, post: np.ndarray, latent: str, seed: int) -> dict:
        if latent == "discrete":
            return {"mi": exact_mi(post), **usage(post)}
        out = {"active_units": active_units(post)}
        if len(self.rows["logvar"]) == len(post):
            mi, se = gaussian_mi(post, np.stack(self.rows["logvar"]), seed)
            out |= {"mi_estimate": mi, "mi_estimate_se": se}
        return out

    def strategy_metrics(self, post: np.ndarray, clusters: np.ndarray, latent: str) -> dict:
        """NMI, Hungarian accuracy (and, discrete, strategy MI) over the examples with a label; {} if none."""
        known = [i for i, s in enumerate(self.rows["strategy"]) if s is not None]
        if not known:
            return {}
        labels = [self.rows["strategy"][i] for i in known]
        table, _ = contingency(labels, clusters[known])
        out = {"strategy_nmi": nmi(table), "strategy_accuracy": hungarian_accuracy(table)}
        if latent == "discrete":
            out["strategy_mi"] = strategy_mi(post[known], labels)
        return out
