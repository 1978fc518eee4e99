"""The E-step: which decoder copy explains each example, as pure functions of tensors.

With K small, the decoder's K passes give every R(k) exactly, so the posterior that minimises the objective
for a fixed decoder is available without the amortised head:

    J(q) = sum_k q(k) R(k) + beta * KL(q || p)   is minimised by
    q*(k) = p(k|x) exp(-R(k) / beta) / Z          (a softmax over -R / beta),

(derivative of the Lagrangian: R(k) + beta (log q(k) - log p(k) + 1) + mu = 0). At beta -> 0 it is a hard
argmin over k. R is the chosen weighting's reconstruction, so the weighting sets *which tokens* separate the
k; its overall scale acts as 1 / temperature.

Used as an E-step (EM; Shen et al. 2019, "Mixture Models for Diverse Machine Translation: Tricks of the
Trade", with a uniform prior against rich-get-richer): decoder copy k is trained on the examples assigned to
k, and the amortised posterior is distilled towards the assignment (``training/objective/loss.py``). A balanced assignment
(Sinkhorn-Knopp equipartition over the batch, as in SwAV, Caron et al. 2020) keeps one k from taking every
example. The "label" mode assigns each example to its ground-truth strategy instead (a supervised warm start
with ``until_step``); ``labelled`` fixes a share of the examples to their label's value (``label_values.py``).
``harden`` gives an example that q* is sure of (one copy at least that share) its one-hot, once the run's code has
formed: two copies that explain an example about as well then part, and where q* is sure of nothing (z not in use)
the step is q* itself.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import replace

import torch
import torch.nn.functional as F

from tokweight.training.config.components import EStepConfig
from tokweight.training.objective.global_batch import LOCAL, GlobalBatch


def exact_posterior(R: torch.Tensor, log_prior: torch.Tensor, temperature: float) -> torch.Tensor:
    """log q*(k) = log_softmax(log p(k) - R(k) / temperature): R (B, K) nats, log_prior (B, K) -> (B, K)."""
    return F.log_softmax(log_prior - R / temperature, -1)


def sinkhorn(log_scores: torch.Tensor, iters: int) -> torch.Tensor:
    """Balanced soft assignment (B, K): rows sum to 1, columns to about B / K (exactly after the
    column step; the last step normalises rows). log_scores (B, K) unnormalised log-weights."""
    B, K = log_scores.shape
    log_a = log_scores
    for _ in range(iters):
        log_a = log_a - torch.logsumexp(log_a, 0, keepdim=True) + math.log(B / K)  # columns: B / K each
        log_a = log_a - torch.logsumexp(log_a, 1, keepdim=True)  # rows: 1 each
    return log_a.exp()


def assignment(R: torch.Tensor, log_prior: torch.Tensor, cfg: EStepConfig, beta: float = 0.0,
               labels: torch.Tensor | None = None, batch: GlobalBatch = LOCAL,
               head: torch.Tensor | None = None, cluster: torch.Tensor | None = None) -> torch.Tensor:
    """The E-step's (B, K) weights of the decoder copies, detached: soft q* (where ``cfg.harden`` > 0, the
    one-hot argmax on the rows whose q* gives one copy at least that share), its hard argmax, or (mode "label")
    the one-hot of ``labels`` (B,) strategy indices. In the other modes ``labels`` (B,), when given, fixes the
    rows whose index is >= 0 to its one-hot (the labelled examples); -1: q*'s.

    R (B, K) nats per copy; log_prior (B, K) the learned prior (ignored under prior "uniform"); head (B, K) the
    amortised head's log q, which ``cfg.head_weight`` weighs into q*'s prior (None: not read); cluster (B, K) the
    base's grouping's log pi (``clusters.Clusters.log_prob``), which ``cfg.cluster_weight`` weighs into R (None: not
    read);
    beta: the step's KL weight, the temperature under ``follow_beta`` (hard at beta = 0).
    Balancing acts on q* before the argmax, so a hard assignment is balanced too, and over
    the global ``batch``: Sinkhorn's columns are sums over all of its rows.
    """
    if cfg.mode is None or cfg.prior is None or cfg.harden is None:
        raise ValueError("the E-step's mode, prior and harden are unset: resolve the config for the latent first "
                         "(EStepConfig.resolved)")
    R = R.detach()
    if cfg.mode == "label":
        if labels is None:
            raise ValueError('estep mode "label" needs the batch\'s strategy labels')
        return one_hot(labels.to(R.device), R.shape[-1], R.dtype)
    log_q, hard = step_posterior(R, log_prior, cfg, beta, head, cluster)
    a = batch.rows(sinkhorn(batch.gather(log_q), cfg.balance_iters)) if cfg.balance_iters else log_q.exp()
    if hard or cfg.harden:  # the argmax's one-hot: every row, or the rows q* is sure of
        top = one_hot(a.argmax(-1), R.shape[-1], R.dtype)
        a = top if hard else torch.where((a.max(-1).values >= cfg.harden)[:, None], top, a)
    if labels is not None:
        labels = labels.to(R.device)
        a = torch.where(labels[:, None] >= 0, one_hot(labels.clamp(min=0), R.shape[-1], R.dtype), a)
    return a


def one_hot(index: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """(B,) indices in [0, k) -> (B, k) one-hot rows of ``dtype``: ``F.one_hot`` without its range check, which
    reads the indices back from the device (a host sync) everywhere but on CUDA."""
    return (index[:, None] == torch.arange(k, device=index.device)).to(dtype)


def step_posterior(R: torch.Tensor, log_prior: torch.Tensor, cfg: EStepConfig, beta: float,
                   head: torch.Tensor | None = None, cluster: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, bool]:
    """(log q* (B, K), whether the step takes its argmax on every row): q* at the step's temperature (``beta``
    under ``follow_beta``) and prior (``cfg.prior``, times the head's q to the power ``cfg.head_weight`` where
    ``head`` (B, K) log q is given); at beta = 0 under ``follow_beta``, the hard argmin of R whatever p. Where
    ``cluster`` (B, K) log pi is given, the base's grouping enters as nats of R, R - ``cfg.cluster_weight`` log pi:
    a cost of a value outside the example's cluster that the temperature does not scale away (under
    ``follow_beta`` a log prior is nothing against R / beta while beta warms up from 0, when the code forms); with
    ``cfg.cluster_relative``, in units of the row's own spread of R over the values, so that it can reorder what
    the decoders tell apart but cannot make them differ where they do not."""
    if cluster is not None and cfg.cluster_weight:
        scale = R.detach().std(-1, keepdim=True) if cfg.cluster_relative else 1.0  # the row's own spread of R
        R = R - cfg.cluster_weight * scale * cluster.detach().to(R.dtype)
    if cfg.follow_beta and beta == 0:  # the beta -> 0 limit of p exp(-R / beta): argmin R whatever p
        return exact_posterior(R, torch.zeros_like(R), cfg.temperature), True
    prior = torch.zeros_like(R) if cfg.prior == "uniform" else log_prior.detach()
    if head is not None and cfg.head_weight:
        prior = prior + cfg.head_weight * head.detach().to(R.dtype)
    return exact_posterior(R, prior, beta if cfg.follow_beta else cfg.temperature), cfg.mode == "hard"


def sure_rows(R: torch.Tensor, log_prior: torch.Tensor, cfg: EStepConfig, beta: float,
              head: torch.Tensor | None = None, cluster: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) bool: the examples the E-step gives a one-hot, as ``assignment`` does before any balancing or label:
    every row of a hard step, else those whose q* gives one copy at least ``cfg.harden`` (none at 0)."""
    log_q, hard = step_posterior(R.detach(), log_prior, cfg, beta, head, cluster)
    if hard or not cfg.harden:
        return torch.full((len(R),), hard, dtype=torch.bool, device=R.device)
    return log_q.exp().max(-1).values >= cfg.harden


def read_likelihood(out, R: torch.Tensor, cfg: EStepConfig, beta: float, cluster: torch.Tensor | None = None):
    """``out`` (a discrete latent's ``CVAEOutput``) with its posterior read with y's likelihood under each value
    (``CVAEConfig.posterior_likelihood``): on the examples the step's E-step is sure of (``sure_rows``),
    log q(k | x, y) = log_softmax(log q_head(k) + log p(y | x, k)), Bayes' rule with the head as the log prior,
    log p(y | x, k) = -sum_t l_t(k) from the K decoder passes, detached; elsewhere the head's q. A z not in use makes
    no example sure, so its q stays the head's. R (B, K) nats: the step's reconstruction, which gives q*; ``cfg``
    the E-step as it acts at the step and ``beta`` its KL weight (``schedules.StepSchedule``); ``cluster`` (B, K) the
    base's grouping's log pi where the step reads it (``assignment``)."""
    sure = sure_rows(R, out.prior, cfg, beta, out.post, cluster)
    log_likelihood = torch.where(sure[:, None], -out.nll.sum(-1), 0).detach()
    return replace(out, post=F.log_softmax(out.post + log_likelihood.to(out.post.dtype), -1))


def strategy_indices(strategies, names: tuple[str, ...], keys) -> torch.Tensor:
    """(B,) index of each example's strategy in ``names``; an example without one, or with a
    strategy not in ``names``, is refused by its key (a label must never be guessed)."""
    index = {name: k for k, name in enumerate(names)}
    bad = [(key, s) for key, s in zip(keys, strategies) if s not in index]
    if bad:
        key, s = bad[0]
        raise ValueError(f"example {key!r}: strategy {s!r} is not one of the dataset's {list(names)} "
                         f"({len(bad)} such examples in the batch)")
    return torch.tensor([index[s] for s in strategies])


def labelled_indices(strategies, names: tuple[str, ...], keys, share: float) -> torch.Tensor:
    """(B,) the strategy index of each labelled example, -1 for the rest. Labelled: it has a strategy and its
    key hashes into the first ``share`` of [0, 1) (the same examples every step, on every rank); a strategy
    not in ``names`` is refused by its key, as in ``strategy_indices``."""
    picked = [s is not None and zlib.crc32(str(key).encode()) < share * 2 ** 32 for key, s in zip(keys, strategies)]
    out = torch.full((len(picked),), -1, dtype=torch.long)
    if any(picked):
        rows = [i for i, p in enumerate(picked) if p]
        out[rows] = strategy_indices([strategies[i] for i in rows], names, [keys[i] for i in rows])
    return out


def step_labels(cfg: EStepConfig, strategies, names: tuple[str, ...], keys) -> torch.Tensor:
    """(B,) what the E-step reads of the batch's labels: every example's strategy index (mode "label", which
    refuses an example without one) or the labelled share's (``cfg.labelled``; -1 for the rest)."""
    if cfg.mode == "label":
        return strategy_indices(strategies, names, keys)
    return labelled_indices(strategies, names, keys, cfg.labelled)


def labelled_weights(labels: torch.Tensor, share: float, batch: GlobalBatch = LOCAL
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """((B,) weights of the examples in the batch's fit, () bool whether to weigh it): global-batch mean 1, under
    which the labelled ones (labels >= 0) carry ``share`` of it and the rest 1 - share, each example of a part
    alike; not weighed (the weights 1) where the global batch lacks either kind. The labelled rows count over the
    global batch, so every rank weighs its rows as one process would; the count stays on the device (no host
    sync), in float64 as the weights are formed."""
    labelled = labels >= 0
    n, n_labelled = labelled.numel() * batch.world, batch.gather(labelled.double()).sum()  # () the labelled rows
    weighted = (n_labelled > 0) & (n_labelled < n)
    w = torch.where(labelled, share * n / n_labelled.clamp(min=1), (1 - share) * n / (n - n_labelled).clamp(min=1))
    return torch.where(weighted, w, 1.0).float(), weighted


def distillation(log_q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy -sum_k a(k) log q(k): amortised log q (B, K), target a (B, K) -> (B,) nats."""
    return -(target.detach() * log_q).sum(-1)


def assigned_reconstruction(R: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """sum_k a(k) R(k) with a detached: R (B, K) -> (B,). Copy k learns from the examples given to k."""
    return (a.detach() * R).sum(-1)


def assignment_kl(a: torch.Tensor, log_prior: torch.Tensor) -> torch.Tensor:
    """KL(a || p) = sum_k a(k) (log a(k) - log p(k)) with 0 log 0 = 0: (B, K) -> (B,) nats; a detached."""
    a = a.detach()
    return (torch.xlogy(a, a) - a * log_prior).sum(-1)
