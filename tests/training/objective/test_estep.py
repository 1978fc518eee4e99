import itertools
import math
from dataclasses import replace

import pytest
import torch

from tokweight.training.cvae.model import CVAEOutput
from tokweight.training.objective.estep import (EStepConfig, assigned_reconstruction, assignment, assignment_kl, distillation,
                                      exact_posterior, read_likelihood, sinkhorn, sure_rows)
from tokweight.training.objective.loss import em_objective, reconstruction
from tokweight.training.cvae.latent import CategoricalLatent
from tokweight.training.objective.schedules import Schedule


def E(**fields) -> EStepConfig:
    """An E-step config with the pure functions' reference settings spelt out (a run resolves them per latent)."""
    return EStepConfig(**{"follow_beta": False, "prior": "uniform", "harden": 0.0, "cluster_weight": 0.0,
                          "cluster_relative": False, **fields})


def acting(cfg: EStepConfig, step: int) -> Schedule:
    """The E-step ``cfg`` as a run's schedule has it act at ``step`` (beta 0, no anchor, no likelihood read)."""
    return Schedule(0.0, 0, 0.0, 0, cfg, False).at(step)


def brute_force_minimiser(R, log_p, beta, grid=60):
    """argmin over a grid of the simplex of sum_k q R + beta KL(q || p), K = 3."""
    best, arg = math.inf, None
    for i, j in itertools.product(range(1, grid), repeat=2):
        if i + j >= grid:
            continue
        q = torch.tensor([i, j, grid - i - j], dtype=torch.float64) / grid
        J = float((q * R).sum() + beta * (q * (q.log() - log_p)).sum())
        if J < best:
            best, arg = J, q
    return arg


def test_exact_posterior_is_the_softmax_and_minimises_the_objective():
    R = torch.tensor([[0.7, 0.2, 1.1]], dtype=torch.float64)
    log_p = torch.tensor([[0.5, 0.2, 0.3]], dtype=torch.float64).log()
    beta = 0.4
    q = exact_posterior(R, log_p, beta).exp()[0]
    unnorm = [0.5 * math.exp(-0.7 / beta), 0.2 * math.exp(-0.2 / beta), 0.3 * math.exp(-1.1 / beta)]
    assert torch.allclose(q, torch.tensor(unnorm, dtype=torch.float64) / sum(unnorm))
    assert torch.allclose(q, brute_force_minimiser(R[0], log_p[0], beta), atol=1.5 / 60)


def test_exact_posterior_goes_hard_as_the_temperature_falls():
    R = torch.tensor([[0.30, 0.31, 0.9]])
    q = exact_posterior(R, torch.zeros(1, 3), 1e-4).exp()
    assert q[0, 0] > 0.999


def test_sinkhorn_equipartitions_a_batch_that_prefers_one_value():
    torch.manual_seed(0)
    scores = torch.randn(12, 3) + torch.tensor([4.0, 0.0, 0.0])  # everyone prefers k = 0
    a = sinkhorn(scores, 50)
    assert torch.allclose(a.sum(1), torch.ones(12), atol=1e-5)
    assert torch.allclose(a.sum(0), torch.full((3,), 4.0), atol=1e-3)
    assert sinkhorn(scores, 0).argmax(1).eq(0).all()  # unbalanced: rich get richer


def test_hard_assignment_is_the_argmin_and_uniform_prior_ignores_the_learned_one():
    R = torch.tensor([[2.0, 1.0, 3.0], [0.1, 0.5, 0.2]])
    log_p = torch.tensor([[0.0, -50.0, 0.0], [-50.0, 0.0, 0.0]])
    hard = assignment(R, log_p, E(mode="hard"))
    assert hard.tolist() == [[0, 1, 0], [1, 0, 0]]
    learned = assignment(R, log_p, E(mode="hard", prior="learned"))
    assert learned.tolist() == [[1, 0, 0], [0, 0, 1]]


def test_the_head_weight_tilts_q_star_towards_the_head_where_the_decoders_tie_and_is_off_at_zero():
    """q* ∝ q_head^gamma exp(-R / T): at gamma 0 the head is not read; where R ties (row 0) q* is the head's q^gamma
    renormalised, where R is sure (row 1) the head barely moves it; the head enters detached."""
    R = torch.tensor([[1.0, 1.0, 1.0], [0.0, 8.0, 8.0]])
    head = torch.log_softmax(torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), -1).requires_grad_()
    off = assignment(R, torch.zeros_like(R), E(mode="soft"), head=head)
    assert torch.equal(off, assignment(R, torch.zeros_like(R), E(mode="soft")))
    on = assignment(R, torch.zeros_like(R), E(mode="soft", head_weight=1.0), head=head)
    assert torch.allclose(on[0], head[0].detach().exp())  # a tie: the head's grouping decides
    assert on[1, 0] > 0.99 and on[1, 1] > off[1, 1]  # the decoders' sure choice stands, tilted a little
    assert not on.requires_grad
    with pytest.raises(ValueError, match="head_weight and cluster_weight must be >= 0"):
        EStepConfig(head_weight=-1.0)


def test_the_cluster_weight_tilts_q_star_towards_the_base_s_grouping_and_is_off_at_zero():
    """q* ∝ exp(-(R - gamma_c log pi) / T), pi the example's cluster: where R ties the grouping decides, the head's
    tilt adds; in nats of R, so at beta -> 0 under follow_beta (hard argmin) it still decides a near tie."""
    R = torch.tensor([[1.0, 1.0, 1.0], [0.0, 8.0, 8.0]])
    cluster = torch.log_softmax(torch.tensor([[0.0, 0.0, 3.0], [0.0, 3.0, 0.0]]), -1)
    off = assignment(R, torch.zeros_like(R), E(mode="soft"), cluster=cluster)
    assert torch.equal(off, assignment(R, torch.zeros_like(R), E(mode="soft")))
    on = assignment(R, torch.zeros_like(R), E(mode="soft", cluster_weight=1.0), cluster=cluster)
    assert torch.allclose(on[0], cluster[0].exp()) and on[1, 0] > 0.99
    head = torch.log_softmax(torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 0.0]]), -1)
    both = assignment(R, torch.zeros_like(R), E(mode="soft", cluster_weight=1.0, head_weight=1.0), head=head,
                      cluster=cluster)
    assert torch.allclose(both[0], torch.softmax(head[0] + cluster[0], -1))
    near_tie = torch.tensor([[1.0, 1.2, 1.1]])
    follow = E(mode="soft", follow_beta=True, cluster_weight=1.0)
    assert assignment(near_tie, torch.zeros(1, 3), follow, beta=0.001, cluster=cluster[:1]).argmax().item() == 2
    assert assignment(near_tie, torch.zeros(1, 3), follow, beta=0.0, cluster=cluster[:1]).tolist() == [[0, 0, 1]]
    with pytest.raises(ValueError, match="head_weight and cluster_weight must be >= 0"):
        EStepConfig(cluster_weight=-0.5)


def test_a_relative_cluster_weight_scales_with_the_decoders_own_spread_and_is_nothing_where_they_tie():
    """``cluster_relative``: the tilt is gamma_c times the row's standard deviation of R over the values: on a row the
    decoders tie it changes nothing, on a row they tell apart it reorders as much as gamma_c std(R) nats of tilt."""
    R = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.3, 0.6]])
    cluster = torch.log_softmax(torch.tensor([[0.0, 0.0, 3.0], [0.0, 0.0, 3.0]]), -1)
    relative = E(mode="soft", cluster_weight=3.0, cluster_relative=True)
    got = assignment(R, torch.zeros_like(R), relative, cluster=cluster)
    plain = assignment(R, torch.zeros_like(R), E(mode="soft"))
    assert torch.allclose(got[0], plain[0])  # a tie stays a tie: the grouping cannot make the values differ
    want = torch.softmax(-(R[1] - 3.0 * R[1].std() * cluster[1]), -1)
    assert torch.allclose(got[1], want) and got[1].argmax() == 2 != plain[1].argmax()  # it reorders what differs


def test_harden_trains_a_sure_example_s_copy_only_and_leaves_an_unsure_one_soft():
    R = torch.tensor([[0.1, 2.0, 2.0], [1.00, 1.05, 1.10]])
    zero = torch.zeros_like(R)
    soft = assignment(R, zero, E(mode="soft", temperature=0.3))
    assert soft[0].max() > 0.9 and soft[1].max() < 0.5
    hardened = assignment(R, zero, E(mode="soft", temperature=0.3, harden=0.5))
    assert hardened[0].tolist() == [1.0, 0.0, 0.0]
    assert torch.equal(hardened[1], soft[1])


def test_harden_is_the_soft_e_step_where_z_is_not_in_use_and_before_harden_from():
    R = torch.tensor([[1.0, 1.01, 0.99], [2.0, 2.0, 2.02]])  # copies alike: no example sure of one
    zero = torch.zeros_like(R)
    cfg = E(mode="soft", temperature=0.3, harden=0.5, harden_from=800)
    assert torch.equal(assignment(R, zero, cfg), assignment(R, zero, E(mode="soft", temperature=0.3)))
    assert acting(cfg, 799).estep.harden == 0.0 and acting(cfg, 800).estep.harden == 0.5
    sure = torch.tensor([[0.0, 3.0, 3.0]])
    assert assignment(sure, torch.zeros_like(sure), acting(cfg, 799).estep)[0, 0] < 1.0
    assert assignment(sure, torch.zeros_like(sure), acting(cfg, 800).estep).tolist() == [[1.0, 0.0, 0.0]]
    assert acting(replace(cfg, harden_from=None), 10 ** 6).estep.harden == 0.0  # a start: not yet compared


def test_sure_rows_are_those_the_e_step_gives_a_one_hot():
    R = torch.tensor([[0.1, 2.0, 2.0], [1.00, 1.05, 1.10], [1.0, 1.0, 1.0]])
    zero = torch.zeros_like(R)
    cfg = E(mode="soft", temperature=0.3, harden=0.5)
    assert sure_rows(R, zero, cfg, 1.0).tolist() == [True, False, False]
    assert sure_rows(R, zero, replace(cfg, harden=0.0), 1.0).tolist() == [False] * 3
    assert sure_rows(R, zero, E(mode="hard"), 1.0).tolist() == [True] * 3
    followed = replace(cfg, follow_beta=True)  # the temperature is beta: at 10, row 0 is no longer sure
    assert sure_rows(R, zero, followed, 10.0).tolist() == [False] * 3
    hardened = assignment(R, zero, cfg)
    assert torch.equal(sure_rows(R, zero, cfg, 1.0), (hardened == 1).any(-1))


def test_the_likelihood_read_adds_log_p_y_on_the_sure_rows_only_and_detached():
    """log q = log_softmax(log q_head - sum_t l_t(k)) where the E-step is sure, q_head elsewhere: Bayes' rule with
    the head as the log prior; its gradient reaches q_head, not the decoder's NLL."""
    torch.manual_seed(0)
    nll = torch.rand(3, 3, 4, dtype=torch.float64)
    nll[0, 0] = 0.01  # example 0: copy 0 explains it (q* sure); examples 1 and 2 about alike across copies
    nll = nll.requires_grad_()
    head = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    post = torch.log_softmax(head, -1)
    out = CVAEOutput(post, torch.zeros(3, 3, dtype=torch.float64).log_softmax(-1), nll, nll.detach()[:, 0])
    R = reconstruction(out, torch.full((3, 4), 0.25, dtype=torch.float64))  # (3, 3)
    sure_of = E(mode="soft", temperature=0.1, harden=0.9)
    got = read_likelihood(out, R, sure_of, 1.0).post
    assert sure_rows(R, out.prior, sure_of, 1.0).tolist() == [True, False, False]
    torch.testing.assert_close(got[0], torch.log_softmax(head[0] - nll[0].sum(-1), -1))
    torch.testing.assert_close(got[1:], post[1:])
    grad_nll, grad_head = torch.autograd.grad(got[:, 0].sum(), [nll, head], allow_unused=True)
    assert grad_nll is None and grad_head[0].abs().sum() > 0
    nobody = E(mode="soft", temperature=0.1, harden=0.0)
    assert torch.equal(read_likelihood(out, R, nobody, 1.0).post, post)  # no hardening: q is the head's


def test_distillation_and_assigned_reconstruction_by_hand():
    log_q = torch.tensor([[0.5, 0.25, 0.25]]).log()
    a = torch.tensor([[0.0, 1.0, 0.0]])
    assert distillation(log_q, a).item() == pytest.approx(math.log(4))
    R = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    assigned_reconstruction(R, torch.tensor([[0.2, 0.8, 0.0]])).sum().backward()
    assert torch.allclose(R.grad, torch.tensor([[0.2, 0.8, 0.0]]))


def test_em_objective_trains_copies_by_assignment_and_the_posterior_by_distillation():
    latent = CategoricalLatent(2, 4, [10, 11])
    nll = torch.tensor([[[1.0, 3.0], [2.0, 0.0]]], requires_grad=True)  # (B=1, K=2, T=2)
    post = torch.tensor([[0.8, 0.2]]).log().requires_grad_()
    prior = torch.tensor([[0.5, 0.5]]).log()
    out = CVAEOutput(post, prior, nll, torch.zeros(1, 2))
    pi = torch.tensor([[0.5, 0.5]])  # R = (2.0, 1.0): k = 1 wins
    obj = em_objective(latent, out, reconstruction(out, pi), beta=0.0, free_bits=0.0, cfg=E(mode="hard"))
    assert obj.loss.item() == pytest.approx(1.0 - math.log(0.2))
    assert obj.recon.item() == pytest.approx(0.8 * 2.0 + 0.2 * 1.0)
    obj.loss.backward()
    assert nll.grad[0, 0].abs().sum() == 0 and nll.grad[0, 1].tolist() == [0.5, 0.5]
    assert torch.allclose(post.grad, torch.tensor([[0.0, -1.0]]))


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        E(mode="viterbi")
    with pytest.raises(ValueError, match="harden must be a share"):
        E(harden=1.5)
    assert EStepConfig(mode="hard", harden=0.5).resolved("discrete", 4, 1).harden == 0.0  # nothing to harden
    assert EStepConfig().resolved("discrete", 4, 1).harden == 0.5
    assert EStepConfig(mode="soft").resolved("continuous", 4, 4).harden == 0.0
    # at k = 2 every q* gives one value at least half, a z not in use included: no hardening unless set above it
    assert EStepConfig().resolved("discrete", 2, 1).harden == 0.0
    assert EStepConfig().resolved("discrete", 3, 1).harden == 0.5
    assert EStepConfig(harden=0.8).resolved("discrete", 2, 1).harden == 0.8
    at_half = EStepConfig(harden=0.5).resolved("discrete", 2, 1)  # a config.json of before the refusal loads
    with pytest.raises(ValueError, match=r"harden 0.5 is at most 1/k = 0.5: .* set it above 1/k, or 0"):
        at_half.check_harden(2)  # where a run trains
    at_half.check_harden(3)
    EStepConfig(harden=0.0).resolved("discrete", 2, 1).check_harden(2)
    with pytest.raises(ValueError, match="temperature"):
        E(temperature=0.0)
    assert not acting(E(mode="hard", until_step=5), 5).em and acting(E(mode="hard"), 10 ** 6).em


def test_follow_beta_is_the_exact_e_step_and_hard_at_beta_zero():
    R = torch.tensor([[0.4, 0.1, 0.9]])
    log_p = torch.tensor([[0.2, 0.3, 0.5]]).log()
    cfg = E(mode="soft", prior="learned", follow_beta=True, temperature=5.0)
    assert torch.allclose(assignment(R, log_p, cfg, beta=0.3), exact_posterior(R, log_p, 0.3).exp())
    assert assignment(R, log_p, cfg, beta=0.0).tolist() == [[0.0, 1.0, 0.0]]


def test_em_objective_fits_the_prior_to_the_assignment_and_leaves_q_out_of_the_kl():
    latent = CategoricalLatent(2, 4, [10, 11])
    nll = torch.tensor([[[1.0, 3.0], [2.0, 0.0]]])
    post = torch.tensor([[0.8, 0.2]]).log().requires_grad_()
    prior = torch.tensor([[0.6, 0.4]]).log().requires_grad_()
    out = CVAEOutput(post, prior, nll, torch.zeros(1, 2))
    obj = em_objective(latent, out, reconstruction(out, torch.tensor([[0.5, 0.5]])), beta=0.5, free_bits=0.0,
                       cfg=E(mode="hard"))
    assert obj.kl_term.item() == pytest.approx(-math.log(0.4))  # KL(one-hot at k=1 || p)
    assert obj.kl.item() == pytest.approx(0.8 * math.log(0.8 / 0.6) + 0.2 * math.log(0.2 / 0.4))
    obj.loss.backward()
    assert torch.allclose(prior.grad, torch.tensor([[0.0, -0.5]]))  # beta * d(-log p_1)
    assert torch.allclose(post.grad, torch.tensor([[0.0, -1.0]]))  # distillation only
    a = torch.tensor([[0.25, 0.75]])
    assert assignment_kl(a, prior.detach()).item() == pytest.approx(0.25 * math.log(0.25 / 0.6) + 0.75 * math.log(0.75 / 0.4))


def test_label_mode_assigns_the_true_strategy_whatever_r_says():
    from tokweight.training.objective.estep import strategy_indices

    labels = strategy_indices(("rotate-left", "copy", "copy"), ("copy", "rotate-left"), ("a", "b", "c"))
    assert labels.tolist() == [1, 0, 0]
    R = torch.tensor([[5.0, 0.0], [9.0, 0.0], [0.0, 1.0]])  # the decoder prefers k = 1 for the first two
    a = assignment(R, torch.zeros(3, 2), E(mode="label", balance_iters=3), labels=labels)
    assert a.tolist() == [[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="needs the batch's strategy labels"):
        assignment(R, torch.zeros(3, 2), E(mode="label"))


def test_labelled_examples_take_their_label_and_the_rest_the_e_step():
    from tokweight.training.objective.estep import labelled_indices

    keys = [f"k{i}" for i in range(2000)]
    strategies = ["copy" if i % 2 else "reverse" for i in range(2000)]
    strategies[7] = None  # no label: never labelled, whatever its key
    share = labelled_indices(strategies, ("copy", "reverse"), keys, 0.1)
    assert 0.08 < (share >= 0).float().mean() < 0.12 and share[7] == -1
    assert all(share[i] == (0 if i % 2 else 1) for i in range(2000) if share[i] >= 0)
    assert torch.equal(labelled_indices(strategies[::-1], ("copy", "reverse"), keys[::-1], 0.1), share.flip(0))
    assert (labelled_indices(strategies, ("copy", "reverse"), keys, 0.0) == -1).all()
    with pytest.raises(ValueError, match="example 'k0': strategy 'sort'"):  # a picked label must be a strategy
        labelled_indices(["sort"] * 4, ("copy", "reverse"), ["k0", "k1", "k2", "k3"], 1.0)
    R = torch.tensor([[5.0, 0.0], [9.0, 0.0], [0.0, 1.0]])  # the E-step prefers k = 1, 1, 0
    for mode in ("soft", "hard"):
        cfg = E(mode=mode, temperature=0.1, labelled=0.5)
        a = assignment(R, torch.zeros(3, 2), cfg, labels=torch.tensor([0, -1, -1]))
        assert a[0].tolist() == [1.0, 0.0]  # labelled: its label, against R
        torch.testing.assert_close(a[1:], assignment(R, torch.zeros(3, 2), cfg)[1:])
    with pytest.raises(ValueError, match="only in mode soft or hard"):
        E(mode="label", labelled=0.1)


def test_labelled_examples_carry_their_share_of_the_fit_however_few():
    from tokweight.training.objective.estep import labelled_weights

    labels = torch.tensor([2, -1, -1, -1, -1, -1, -1, -1])  # one labelled example in 8
    w, weighted = labelled_weights(labels, 0.5)
    assert weighted and w[0].item() == 4.0 and torch.all(w[1:] == 4 / 7)  # half the weight on 1 row, half on 7
    torch.testing.assert_close(w.mean(), torch.tensor(1.0))
    torch.testing.assert_close(labelled_weights(labels, 0.2)[0][labels >= 0].sum() / 8, torch.tensor(0.2))
    for one_kind in (torch.full((8,), -1), torch.zeros(8)):  # none labelled, or all: not weighed
        w, weighted = labelled_weights(one_kind, 0.5)
        assert not weighted and torch.equal(w, torch.ones(8))
    with pytest.raises(ValueError, match="labelled_weight must be a share in"):
        E(labelled_weight=1.0)


def test_the_labelled_weight_moves_only_a_run_with_labels():
    """The fit weighs the labelled rows up; with no labelled row in the batch it is the unweighted objective."""
    from dataclasses import replace

    g = torch.Generator().manual_seed(0)
    out = CVAEOutput(post=torch.randn(6, 2, generator=g).log_softmax(-1), prior=torch.zeros(6, 2).log_softmax(-1),
                     nll=torch.rand(6, 2, 5, generator=g), zfree_nll=torch.zeros(6, 5))
    R = reconstruction(out, torch.full((6, 5), 0.2))  # (6, 2)
    LATENT = CategoricalLatent(2, 8, [0, 1])
    cfg = E(mode="soft", labelled=0.5)
    none = torch.full((6,), -1)
    plain = em_objective(LATENT, out, R, 0.3, 0.0, cfg, none).loss
    assert plain == em_objective(LATENT, out, R, 0.3, 0.0, replace(cfg, labelled_weight=0.2), none).loss
    one = torch.tensor([1, -1, -1, -1, -1, -1])
    weighted = em_objective(LATENT, out, R, 0.3, 0.0, cfg, one).loss
    even = em_objective(LATENT, out, R, 0.3, 0.0, replace(cfg, labelled_weight=1 / 6), one).loss
    assert not torch.isclose(weighted, even)


def test_an_example_without_a_known_strategy_is_refused_by_key():
    from tokweight.training.objective.estep import strategy_indices

    with pytest.raises(ValueError, match=r"example 'k7': strategy None .*\(2 such examples"):
        strategy_indices(("copy", None, "reverse"), ("copy", "rotate-left"), ("k1", "k7", "k9"))


def gaussian_out(R_per_copy, mu, logvar, prior_mu, prior_logvar, z):
    """A continuous latent's CVAEOutput with one S token whose NLL per copy is R_per_copy (B, S)."""
    return CVAEOutput((mu, logvar), (prior_mu, prior_logvar), R_per_copy[..., None],
                      torch.zeros(R_per_copy.shape[0], 1), z=z)


def test_gaussian_latent_draws_its_samples_as_copies_and_one_sample_is_the_old_draw():
    from tokweight.training.cvae.latent import GaussianLatent

    mu, logvar = torch.randn(3, 2), torch.randn(3, 2)
    one, _ = GaussianLatent(2, 4, samples=1).decoder_inputs((mu, logvar), torch.Generator().manual_seed(5))
    noise = torch.randn(3, 2, generator=torch.Generator().manual_seed(5))
    assert torch.equal(one, mu + (0.5 * logvar).exp() * noise)  # runs before the samples kept their noise
    latent = GaussianLatent(2, 4, samples=4)
    z, _ = latent.decoder_inputs((mu, logvar), torch.Generator().manual_seed(5))
    assert z.shape == (12, 2) and latent.copies == 4
    eps = torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(5))
    assert torch.allclose(z.view(3, 4, 2)[1, 2], mu[1] + (0.5 * logvar[1]).exp() * eps[1, 2])  # copy i*S + s
    normal = torch.distributions.Normal(mu[:, None], (0.5 * logvar[:, None]).exp())
    assert torch.allclose(latent.log_density((mu, logvar), z), normal.log_prob(z.view(3, 4, 2)).sum(-1), atol=1e-6)
    assert latent.expectation(torch.tensor([[1.0, 2.0, 3.0, 6.0]]), None).item() == 3.0


def test_continuous_e_step_weighs_draws_by_prior_over_proposal_and_distils_q_to_them():
    from tokweight.training.cvae.latent import GaussianLatent

    latent = GaussianLatent(1, 4, samples=2)
    mu, logvar = torch.zeros(1, 1, requires_grad=True), torch.zeros(1, 1, requires_grad=True)
    prior_mu, prior_logvar = torch.full((1, 1), 0.5, requires_grad=True), torch.zeros(1, 1)
    z = torch.tensor([[1.0], [-1.0]])  # draw 0 at +1, draw 1 at -1
    R = torch.tensor([[0.3, 0.5]], requires_grad=True)
    beta = 0.4
    out = gaussian_out(R, mu, logvar, prior_mu, prior_logvar, z)
    obj = em_objective(latent, out, reconstruction(out, torch.ones(1, 1)), beta=beta, free_bits=0.0,
                       cfg=E(mode="soft", follow_beta=True, prior="learned"))
    # q* = p exp(-R / beta) / Z with q as the proposal: w_s = p(z_s) / q(z_s) * exp(-R_s / beta)
    log_w = torch.tensor([-0.5 * 0.25 + 0.5 - 0.3 / beta, -0.5 * 2.25 + 0.5 - 0.5 / beta])
    a = torch.softmax(log_w, 0)
    obj.loss.backward()
    assert torch.allclose(R.grad[0], a)  # each draw's reconstruction by its weight
    assert torch.allclose(mu.grad, -(a * z[:, 0]).sum().view(1, 1))  # d/dmu of -sum_s a_s log q(z_s)
    assert torch.allclose(logvar.grad, (0.5 * (a * (1 - z[:, 0] ** 2)).sum()).view(1, 1))
    assert torch.allclose(prior_mu.grad, -beta * (a * (z[:, 0] - 0.5)).sum().view(1, 1))  # the prior fits the draws
    log_q = -0.5 * z[:, 0] ** 2 - 0.5 * math.log(2 * math.pi)
    log_p = -0.5 * (z[:, 0] - 0.5) ** 2 - 0.5 * math.log(2 * math.pi)
    assert obj.kl_term.item() == pytest.approx(float((a * (log_q + torch.log(2 * a) - log_p)).sum()), rel=1e-5)


def test_a_continuous_e_step_is_refused_what_it_cannot_do():
    from tokweight.training.config.components import CVAEConfig
    from tokweight.training.config.train import IOConfig, TrainConfig

    io = IOConfig(checkpoint="c", data="d", out="o", store="s")
    continuous = CVAEConfig(latent="continuous")
    assert continuous.samples == 4 and CVAEConfig().samples == 1
    assert TrainConfig(io=io, cvae=continuous).estep.mode == "hard"  # the continuous latent's default
    for estep, match in ((EStepConfig(mode="label"), "mode soft or hard"),
                         (EStepConfig(mode="soft", prior="learned", balance_iters=3), "balance_iters 0"),
                         (EStepConfig(mode="hard", prior="uniform"), "prior 'learned'"),
                         (EStepConfig(mode="hard", prior="learned", labelled=0.1), "labelled 0"),
                         (EStepConfig(mode="hard", prior="learned", head_weight=1.0), "head_weight 0"),
                         (EStepConfig(mode="hard", prior="learned", cluster_weight=1.0), "cluster_weight 0")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(io=io, cvae=continuous, estep=estep)
    with pytest.raises(ValueError, match="samples >= 2"):
        TrainConfig(io=io, cvae=CVAEConfig(latent="continuous", samples=1))
    TrainConfig(io=io, cvae=CVAEConfig(latent="continuous", samples=1), estep=EStepConfig(mode="off"))  # fine
    with pytest.raises(ValueError, match="needs a continuous latent"):
        CVAEConfig(samples=2)
