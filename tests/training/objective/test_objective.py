"""objective.py's J against a hand computation: two examples, K = 2, two tokens each, hand-written NLLs, b, head
and prior, the step's terms from a run's schedule; the likelihood read included. The hand side is plain Python
floats, term by term as the module's docstring writes J."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from tokweight.training.config.components import CVAEConfig, EStepConfig, WeightingParams
from tokweight.training.cvae.model import CVAEOutput
from tokweight.training.cvae.latent import CategoricalLatent
from tokweight.training.objective.loss import step_loss
from tokweight.training.objective.schedules import Schedule
from tokweight.training.config.train import IOConfig, LossConfig, TrainConfig

NLL = [[[0.2, 0.4], [1.0, 2.0]],  # example 0: copy 0 explains it (q* sure of it)
       [[0.5, 0.5], [0.6, 0.3]]]  # example 1: both copies about alike
B_ = [[0.5, 1.5], [1.0, 1.0]]  # the base model's surprisal, nats
HEAD = [[0.6, 0.4], [0.3, 0.7]]  # q from the posterior head
PRIOR = [[0.7, 0.3], [0.4, 0.6]]
EPS, BETA, W_ANCHOR, MARGIN, HARDEN = 1e-6, 0.5, 2.0, 0.1, 0.6

CFG = TrainConfig(IOConfig(checkpoint="c", data="d", out="o"), cvae=CVAEConfig(k=2),
                  loss=LossConfig(policy="frozen", beta=BETA, beta_warmup_steps=0, anchor_weight=W_ANCHOR,
                                  anchor_margin=MARGIN, anchor_start_step=0, eps=EPS),
                  estep=EStepConfig(harden=HARDEN, harden_from=0))  # soft, follow_beta, uniform prior: the defaults


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def by_hand(em: bool, reads: bool) -> dict:
    """J and its parts, term by term."""
    pi = [[b / (sum(row) + EPS) for b in row] for row in B_]
    R = [[sum(p * l for p, l in zip(pi[i], NLL[i][k])) for k in range(2)] for i in range(2)]
    q_star = [softmax([-r / BETA for r in R[i]]) for i in range(2)]  # uniform prior, temperature beta
    sure = [max(q) >= HARDEN for q in q_star]
    q = [softmax([math.log(HEAD[i][k]) - (sum(NLL[i][k]) if reads and sure[i] else 0.0) for k in range(2)])
         for i in range(2)]
    anchor = sum(q[i][k] * sum(max(0.0, l - b - MARGIN) for l, b in zip(NLL[i][k], B_[i])) / 2
                 for i in range(2) for k in range(2)) / 2
    if em:
        a = [[float(k == max(range(2), key=lambda c: q_star[i][c])) for k in range(2)] if sure[i] else q_star[i]
             for i in range(2)]
        fit = sum(sum(a[i][k] * R[i][k] - a[i][k] * math.log(q[i][k]) for k in range(2)) for i in range(2)) / 2
        kl = sum(sum(a[i][k] * (math.log(a[i][k]) if a[i][k] > 0 else 0.0) - a[i][k] * math.log(PRIOR[i][k])
                     for k in range(2)) for i in range(2)) / 2
    else:
        fit = sum(sum(q[i][k] * R[i][k] for k in range(2)) for i in range(2)) / 2
        kl = sum(sum(q[i][k] * math.log(q[i][k] / PRIOR[i][k]) for k in range(2)) for i in range(2)) / 2
    return {"J": fit + BETA * kl + W_ANCHOR * anchor, "R": R, "q": q, "sure": sure, "anchor": anchor,
            "kl_term": kl, "recon": sum(sum(q[i][k] * R[i][k] for k in range(2)) for i in range(2)) / 2}


def computed(em: bool, reads: bool):
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = CVAEOutput(t(HEAD).log(), t(PRIOR).log(), t(NLL), t(B_))
    at = Schedule.of(CFG).at(0)
    at = replace(at, em=em, reads_likelihood=reads)
    latent = CategoricalLatent(2, 4, [10, 11])
    return step_loss(latent, out, t(B_), torch.ones(2, 2, dtype=torch.bool), CFG.loss, at, WeightingParams(eps=EPS))


def test_the_schedule_gives_the_step_the_terms_the_hand_computation_takes():
    at = Schedule.of(CFG).at(0)
    assert (at.beta, at.anchor_weight, at.em, at.reads_likelihood) == (BETA, W_ANCHOR, True, True)
    assert (at.estep.mode, at.estep.follow_beta, at.estep.prior, at.estep.harden) == ("soft", True, "uniform", HARDEN)


def test_j_with_the_e_step_and_the_likelihood_read_is_the_hand_computation():
    want, terms = by_hand(em=True, reads=True), computed(em=True, reads=True)
    assert want["sure"] == [True, False]  # the read and the hardening act on example 0 only
    torch.testing.assert_close(terms.R, torch.tensor(want["R"], dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(terms.out.post.exp(), torch.tensor(want["q"], dtype=torch.float64), rtol=0, atol=1e-12)
    assert math.isclose(terms.anchor.item(), want["anchor"], abs_tol=1e-12) and want["anchor"] > 0
    assert math.isclose(terms.obj.kl_term.item(), want["kl_term"], abs_tol=1e-12)
    assert math.isclose(terms.obj.recon.item(), want["recon"], abs_tol=1e-12)
    assert math.isclose(terms.loss.item(), want["J"], abs_tol=1e-12)
    assert not math.isclose(want["J"], by_hand(em=True, reads=False)["J"], abs_tol=1e-3)  # the read moves J


def test_j_without_the_read_and_with_the_plain_objective_are_the_hand_computation():
    for em, reads in ((True, False), (False, True), (False, False)):
        want, terms = by_hand(em, reads), computed(em, reads)
        assert math.isclose(terms.loss.item(), want["J"], abs_tol=1e-12), (em, reads)
        assert terms.estep == em
    head = computed(em=True, reads=False).out.post.exp()
    torch.testing.assert_close(head, torch.tensor(HEAD, dtype=torch.float64), rtol=0, atol=1e-12)  # no read


def test_the_anchor_weighs_in_from_its_start_step_only():
    late = Schedule.of(replace(CFG, loss=replace(CFG.loss, anchor_start_step=5)))
    assert [late.at(s).anchor_weight for s in (4, 5)] == [0.0, W_ANCHOR]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = CVAEOutput(t(HEAD).log(), t(PRIOR).log(), t(NLL), t(B_))
    terms = step_loss(CategoricalLatent(2, 4, [10, 11]), out, t(B_), torch.ones(2, 2, dtype=torch.bool), CFG.loss,
                      late.at(4), WeightingParams(eps=EPS))
    assert terms.anchor.item() > 0 and terms.loss.item() == terms.obj.loss.item()  # measured, not added
