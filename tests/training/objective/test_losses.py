import math

import pytest
import torch

from tokweight.training.config.components import check_free_bits
from tokweight.training.objective.terms import (WEIGHTINGS, WeightingParams, anchor_penalty, categorical_kl, free_bits_kl, gaussian_kl,
                                       reconstruction_weights, surprisal_share_weights, weighted_reconstruction)

# two examples, T = 3 and 2 (T_max = 3); the second is padded
B_ = torch.tensor([[0.6, 0.3, 0.1], [2.0, 0.0, 9.9]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
NLL = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]])
P = WeightingParams(eps=1e-6, eps_inv=0.5, dataset_mean_b=0.8)


def hand(name):
    """R per example, computed token by token in float64 from the docs/contract.md §3 table."""
    out = []
    for i in range(2):
        T = int(MASK[i].sum())
        b, l = B_[i, :T].double().tolist(), NLL[i, :T].double().tolist()
        uniform = sum(l) / T
        if name == "uniform":
            out.append(uniform)
        elif name == "sum":
            out.append(sum(l))
        elif name == "surprisal-share":
            out.append(sum(w * x for w, x in zip(b, l)) / (sum(b) + P.eps))
        elif name == "inverse-surprisal":
            w = [1 / (bt + P.eps_inv) for bt in b]
            out.append(sum(wt * x for wt, x in zip(w, l)) / (sum(w) + P.eps))
        elif name == "distribution-rescale":
            out.append(uniform / P.dataset_mean_b)
        elif name == "excess-share":
            floor = sorted(b)[(T - 1) // 2]  # the lower median
            w = [max(bt - floor, 0.0) for bt in b]
            out.append(sum(wt * x for wt, x in zip(w, l)) / (sum(w) + P.eps))
        elif name == "example-inverse":
            v = [1 / (sum(B_[j, :int(MASK[j].sum())].tolist()) / int(MASK[j].sum()) + P.eps) for j in range(2)]
            out.append(uniform * v[i] / (sum(v) / 2))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", WEIGHTINGS)
def test_each_weighting_against_hand_computation(name):
    pi, degenerate = reconstruction_weights(name, B_, MASK, P)
    R = weighted_reconstruction(NLL, pi)
    torch.testing.assert_close(R.double(), hand(name), rtol=1e-6, atol=1e-6)
    assert not degenerate.any()
    assert (pi[~MASK] == 0).all()  # padding carries no weight


def test_surprisal_share_is_the_share_of_b():
    pi = surprisal_share_weights(B_, MASK, 1e-6)
    torch.testing.assert_close(pi[0], torch.tensor([0.6, 0.3, 0.1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(pi[1], torch.tensor([1.0, 0.0, 0.0]), atol=1e-5, rtol=0)


def test_weights_stop_the_gradient():
    b = B_.clone().requires_grad_(True)
    pi, _ = reconstruction_weights("surprisal-share", b, MASK, P)
    assert not pi.requires_grad


def test_mixing_weight_interpolates():
    lam = 0.25
    pi, _ = reconstruction_weights("surprisal-share", B_, MASK, P, lam=lam)
    R = weighted_reconstruction(NLL, pi).double()
    torch.testing.assert_close(R, (1 - lam) * hand("uniform") + lam * hand("surprisal-share"))
    with pytest.raises(ValueError, match="mixing"):
        reconstruction_weights("surprisal-share", B_, MASK, P, lam=1.5)


def test_degenerate_examples_fall_back_to_uniform_and_are_counted():
    b = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    pi, degenerate = reconstruction_weights("surprisal-share", b, MASK, P)
    assert degenerate.tolist() == [True, False]
    torch.testing.assert_close(pi[0], torch.full((3,), 1 / 3))
    _, degenerate_sum = reconstruction_weights("sum", b, MASK, P)
    assert not degenerate_sum.any()  # sum does not read b


def test_micro_batch_and_padding_invariance():
    gen = torch.Generator().manual_seed(0)
    T = torch.randint(2, 9, (12,), generator=gen)
    mask = torch.arange(8)[None, :] < T[:, None]
    b = torch.rand(12, 8, generator=gen) * mask
    nll = torch.rand(12, 8, generator=gen) * 3
    for name in ("uniform", "sum", "surprisal-share", "inverse-surprisal", "distribution-rescale"):
        full = weighted_reconstruction(nll, reconstruction_weights(name, b, mask, P)[0]).sum() / 12
        parts = sum(weighted_reconstruction(nll[s], reconstruction_weights(name, b[s], mask[s], P)[0]).sum()
                    for s in (slice(0, 5), slice(5, 12))) / 12
        torch.testing.assert_close(full, parts)
        # extra padding columns holding garbage change nothing
        pad = lambda t, v: torch.cat([t, torch.full((12, 3), v, dtype=t.dtype)], 1)
        padded = weighted_reconstruction(pad(nll, 5.0), reconstruction_weights(
            name, pad(b, 7.0), pad(mask, False), P)[0]).sum() / 12
        torch.testing.assert_close(full, padded)
    # example-inverse normalises over the batch it sees: weights computed once on the
    # whole batch, then sliced, give the same loss as the whole batch
    pi, _ = reconstruction_weights("example-inverse", b, mask, P)
    full = weighted_reconstruction(nll, pi).sum()
    parts = weighted_reconstruction(nll[:5], pi[:5]).sum() + weighted_reconstruction(nll[5:], pi[5:]).sum()
    torch.testing.assert_close(full, parts)


def test_weighted_reconstruction_broadcasts_over_latent_copies():
    nll = torch.stack([NLL, 2 * NLL], 1)  # (B, K=2, T)
    pi, _ = reconstruction_weights("surprisal-share", B_, MASK, P)
    R = weighted_reconstruction(nll, pi)
    assert R.shape == (2, 2)
    torch.testing.assert_close(R[:, 1], 2 * R[:, 0])


def test_kl_terms():
    log_q = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    log_p = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    kl = categorical_kl(log_q, log_p)
    torch.testing.assert_close(kl, torch.tensor([0.0, 0.9 * math.log(1.8) + 0.1 * math.log(0.2)]))
    mu_q, lv_q, mu_p, lv_p = torch.tensor([[1.0]]), torch.tensor([[math.log(4.0)]]), torch.zeros(1, 1), torch.zeros(1, 1)
    q = torch.distributions.Normal(mu_q, lv_q.mul(0.5).exp())
    p = torch.distributions.Normal(mu_p, lv_p.mul(0.5).exp())
    torch.testing.assert_close(gaussian_kl(mu_q, lv_q, mu_p, lv_p), torch.distributions.kl_divergence(q, p))


def test_free_bits():
    kl = torch.tensor([[0.1, 1.0], [0.3, 3.0]])  # (B, D)
    torch.testing.assert_close(free_bits_kl(kl, 0.5), torch.tensor(0.5 + 2.0))
    torch.testing.assert_close(free_bits_kl(kl, 0.0), torch.tensor(0.2 + 2.0))
    check_free_bits(0.5, "discrete", 4)
    with pytest.raises(ValueError, match="log K"):
        check_free_bits(math.log(4), "discrete", 4)
    check_free_bits(5.0, "continuous", 4)


def test_anchor_penalty_against_hand_computation():
    """mean_t relu(l_t - b_t - m) over S per copy; masked tokens count neither above nor in the mean."""
    nll = torch.tensor([[[0.5, 3.0, 0.0], [2.0, 0.1, 9.0]]])  # (B=1, K=2, T=3), last token masked
    b = torch.tensor([[1.0, 0.2, 0.0]])
    mask = torch.tensor([[True, True, False]])
    # copy 0: relu(0.5-1-0.1)=0, relu(3-0.2-0.1)=2.7 -> 1.35; copy 1: relu(2-1-0.1)=0.9, relu(0.1-0.2-0.1)=0 -> 0.45
    torch.testing.assert_close(anchor_penalty(nll, b, mask, 0.1), torch.tensor([[1.35, 0.45]]))
    nll.requires_grad_(True)
    anchor_penalty(nll, b.requires_grad_(True), mask, 0.1).sum().backward()
    torch.testing.assert_close(nll.grad, torch.tensor([[[0.0, 0.5, 0.0], [0.5, 0.0, 0.0]]]))
    assert b.grad is None  # b is the stop-gradient baseline


def test_excess_share_gives_the_decision_its_share_back_from_a_noise_floor():
    """One decision token (b 0.69) among 16 tokens at the base's residual 0.3 +- 0.05 nats: surprisal-share
    gives the decision about 1/8, excess-share most of it; padding beyond S does not move the median."""
    g = torch.Generator().manual_seed(0)
    b = torch.cat([torch.tensor([[0.69]]), 0.3 + 0.05 * torch.randn(1, 16, generator=g), torch.full((1, 8), 5.0)], 1)
    mask = torch.arange(25)[None] < 17
    share = surprisal_share_weights(b, mask, P.eps)[0, 0].item()
    excess = reconstruction_weights("excess-share", b, mask, P)[0][0]
    assert share < 0.15 and excess[0].item() > 0.6
    assert (excess[~mask[0]] == 0).all() and excess.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_excess_share_of_a_flat_example_is_surprisal_share():
    b, mask = torch.full((1, 5), 0.4), torch.ones(1, 5, dtype=torch.bool)
    pi, degenerate = reconstruction_weights("excess-share", b, mask, P)
    torch.testing.assert_close(pi, surprisal_share_weights(b, mask, P.eps))
    assert not degenerate.any()


def test_each_weighting_declares_what_it_needs():
    """A weighting that reads an example's own b falls back to uniform where b sums to 0; one that reads the
    dataset's mean needs a store (TrainConfig refuses it without one)."""
    from tokweight.training.config.train import IOConfig, LossConfig, TrainConfig

    b, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    for name, weighting in WEIGHTINGS.items():
        _, degenerate = reconstruction_weights(name, b, mask, P)
        assert bool(degenerate.all()) == weighting.per_example, name
    io = IOConfig(checkpoint="c", data="d", out="o")
    assert [n for n, w in WEIGHTINGS.items() if w.needs_dataset_mean] == ["distribution-rescale"]
    with pytest.raises(ValueError, match="needs --store"):
        TrainConfig(io, loss=LossConfig(weighting="distribution-rescale", policy="frozen"))
