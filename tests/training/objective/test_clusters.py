"""The base's grouping as a prior of the E-step (``training/objective/clusters.py``)."""

from __future__ import annotations

import pytest
import torch

from tokweight.training.config.components import EStepConfig
from tokweight.training.objective.clusters import Agreement, Clusters


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


def choices(values: torch.Tensor, k: int) -> torch.Tensor:
    """R (B, K) whose argmin is ``values`` (B,): what the decoders choose."""
    return 1.0 - torch.nn.functional.one_hot(values, k).float()


def test_agreement_tilts_nothing_until_the_decoders_choose_by_cluster_then_toward_their_value_whatever_its_index():
    k, n = 4, 64
    cluster = torch.arange(k).repeat(n)  # (k n,) balanced
    log_pi = (10 * torch.nn.functional.one_hot(cluster, k).float()).log_softmax(-1)  # sure of its cluster
    table = Agreement.start(k, torch.device("cpu"), "agreement")
    assert table.tilt(log_pi).abs().max() < 1e-6  # independent at the start: no tilt
    for _ in range(50):  # the decoders choose value 2 on every line: independent of the cluster
        table.update(log_pi, choices(torch.full((k * n,), 2), k))
    assert table.tilt(log_pi).abs().max() < 1e-5
    values = torch.tensor([3, 0, 2, 1])  # cluster c's lines chosen by value values[c], most of the time
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        lean = torch.rand(k * n, generator=g) < 0.7
        chosen = torch.where(lean, values[cluster], torch.randint(k, (k * n,), generator=g))
        table.update(log_pi, choices(chosen, k))
    tilt = table.tilt(log_pi)
    assert torch.equal(tilt.argmax(-1), values[cluster])
    assert (tilt.max(-1).values > 0.5).all() and torch.allclose(table.joint.sum(), torch.tensor(1.0))


def test_agreement_keeps_its_table_through_json_and_leaves_the_steps_log_pi_alone():
    table = Agreement.start(3, torch.device("cpu"), "agreement")
    log_pi = torch.randn(8, 3).log_softmax(-1).requires_grad_()
    table.update(log_pi, torch.randn(8, 3))
    again = Agreement.start(3, torch.device("cpu"), "agreement", table.to_json())
    assert torch.allclose(again.joint, table.joint) and not table.tilt(log_pi).requires_grad


def test_an_unknown_cluster_map_is_refused_by_name():
    with pytest.raises(ValueError, match="estep cluster_map must be one of"):
        EStepConfig(cluster_map="identities")


def test_matched_gives_each_value_one_cluster_where_the_decoders_lean_and_nothing_where_they_do_not():
    """"matched": value k's tilt is log pi of the cluster its decoders win most (one to one), at a weight that
    is 0 for an independent table and grows as the decoders follow the grouping."""
    k, n = 4, 64
    cluster = torch.arange(k).repeat(n)
    log_pi = (10 * torch.nn.functional.one_hot(cluster, k).float()).log_softmax(-1)
    table = Agreement.start(k, torch.device("cpu"), "matched")
    assert table.matched(log_pi).abs().max() < 1e-6
    values = torch.tensor([2, 0, 3, 1])  # cluster c's lines lean to value values[c]
    g = torch.Generator().manual_seed(0)
    weights = []
    for _ in range(3):
        for _ in range(100):
            lean = torch.rand(k * n, generator=g) < 0.4
            chosen = torch.where(lean, values[cluster], torch.randint(k, (k * n,), generator=g))
            table.update(log_pi, choices(chosen, k))
        tilt = table.matched(log_pi)
        assert torch.equal(tilt.argmax(-1), values[cluster])  # toward the cluster's value, whatever its index
        weights.append(float(-tilt.min(-1).values.mean()))
    assert 0 < weights[0] < weights[-1] < 10  # the weight grows with the table's agreement, below identity's
