"""The base's grouping as a prior of the E-step (``training/objective/clusters.py``)."""

from __future__ import annotations

import pytest
import torch

from tokweight.training.objective.clusters import Clusters


def blobs(k: int, n: int, d: int, gap: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(k * n, d) points around k centres ``gap`` apart along their own axis, and each point's blob."""
    g = torch.Generator().manual_seed(seed)
    centres = gap * torch.eye(k, d)
    which = torch.arange(k).repeat_interleave(n)
    return centres[which] + torch.randn(k * n, d, generator=g), which


def margin(log_pi: torch.Tensor) -> float:
    """Mean log-odds of an example's likeliest cluster against its second."""
    top = log_pi.topk(2, -1).values
    return float((top[:, 0] - top[:, 1]).mean())


def test_separate_groups_give_each_example_its_own_cluster_and_no_grouping_a_small_tilt():
    x, which = blobs(k=3, n=200, d=4, gap=12.0)
    clusters = Clusters.fit(x, 3)
    log_pi = clusters.log_prob(x)
    assigned = log_pi.argmax(-1)
    for blob in range(3):  # one cluster per blob, whichever its index
        assert assigned[which == blob].unique().numel() == 1
    assert assigned.unique().numel() == 3
    assert log_pi.exp().sum(-1).allclose(torch.ones(len(x)))
    structureless = Clusters.fit(torch.randn(600, 4, generator=torch.Generator().manual_seed(1)), 3)
    noise = torch.randn(600, 4, generator=torch.Generator().manual_seed(2))
    assert margin(structureless.log_prob(noise)) < margin(log_pi) / 5


def test_the_fit_is_deterministic_and_reads_any_dtype_in_float32():
    x, _ = blobs(k=2, n=50, d=8, gap=6.0)
    a, b = Clusters.fit(x, 2), Clusters.fit(x.clone(), 2)
    assert torch.equal(a.centres, b.centres) and a.spread == b.spread
    out = a.log_prob(x.bfloat16().requires_grad_())
    assert out.dtype == torch.float32 and not out.requires_grad


def test_fewer_lines_than_clusters_are_refused_by_name():
    with pytest.raises(ValueError, match="cluster_weight: fitting 4 clusters needs at least 4 training lines"):
        Clusters.fit(torch.randn(3, 8), 4)
