"""Evidence that z is used: decode control against the references on labelled (converted-style) data,
the flat-posterior rule that marks strategy NMI / accuracy as not informative, and the continuous
latent's Monte Carlo MI estimate against hand computations."""

import json
import math

import numpy as np
import pytest
import torch

from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.report.eval_md import eval_markdown, write_eval_md
from tokweight.training.config.components import CVAEConfig
from tokweight.training.evaluation.verdict import (CONTROL_FLOOR, MIN_REPRODUCTIONS, label_free_control, likelihood_control,
                                        reference_control, reproduction_by_label, strategy_execution, value_report,
                                        z_use)
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import run_eval
from tokweight.training.evaluation.metrics import EvalRecords, gaussian_mi
from tokweight.experiments.recipes import with_recipe
from tokweight.training.loop.train import run as train
from tokweight.training.config.base import BaseTrainConfig
from tokweight.training.loop.train_base import run as train_base
from tokweight.training.config.train import (
    IOConfig,
    LogConfig,
    LossConfig,
    OptimConfig,
    TrainConfig,
)


def lead_samples(n: int, seed: int) -> list[Sample]:
    """y = (c, e, e, e, e): the strategy "lead-c" picks c in {a, b} independently of x; the rest is fixed."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = tuple(rng.choice(list("abcd"), size=int(rng.integers(1, 5))))
        c = str(rng.choice(["a", "b"]))
        out.append(Sample(key=f"s{i:05d}", x=x, y=(c,) + ("e",) * 4, strategy=f"lead-{c}", t0=0))
    return out


@pytest.fixture(scope="module")
def lead_run(tmp_path_factory):
    """(data, run dir): converted-style data (shards + a convert dataset.json, no generator to ask) and a
    CVAE taught the true strategy (survival recipe: label E-step) on a base model trained on it."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lead")
    for split, seed in (("train", 1), ("val", 2), ("test", 3)):
        write_shards(lead_samples(128, seed), root / "data" / split, shard_size=64)
    (root / "data" / "dataset.json").write_text(json.dumps(
        {"generator": "tokweight.convert", "symbols": list("abcde"), "strategies": ["lead-a", "lead-b"]}))
    train_base(BaseTrainConfig(data=str(root / "data"), out=str(root / "base"), steps=400, batch_size=32, d_model=32,
                               n_head=2, eval_every=400, warmup_steps=10, lr=3e-3))
    cfg = TrainConfig(IOConfig(checkpoint=str(root / "base"), data=str(root / "data"), out=str(root / "run"),
                               num_workers=0),
                      cvae=CVAEConfig(k=2, cond="token"),
                      loss=LossConfig(policy="frozen", token_weighted_reconstruction_weight=0.5,
                                      beta=0.3, beta_warmup_steps=0, anchor_weight=0.0),
                      optim=OptimConfig(steps=200, batch_size=16, lr=3e-3), log=LogConfig(eval_every=0))
    train(with_recipe(cfg, "survival"))
    return root / "data", root / "run"


def test_decode_control_on_converted_data_matches_the_references(lead_run):
    data, run_dir = lead_run
    result = run_eval(EvalConfig(run=str(run_dir), data=str(data), split="test", decode_examples=64))
    control = result["decode"]["reference"]
    assert control["measured"] and control["examples"] == 64 and control["unassigned"] == 0
    assert control["exact_match"] >= 0.9 and control["chance_exact_match"] <= 0.1 and control["above_chance"]
    assert {r["strategy"] for r in control["per_latent"].values()} == {"lead-a", "lead-b"}
    assert "executes" not in result["decode"] and "control_accuracy" not in result["decode"]  # no generator
    for row in result["decode"]["sample_outputs"]:  # the rates are read off these decodes
        mine = row["outputs"][row["assigned_latent"]]
        assert mine["matches_reference"] == (mine["y"] == row["reference"])
    verdict = result["z_used"]
    assert verdict["used"] and verdict["statement"].startswith(verdict["outcome"]) and verdict["strategy_nmi"] > 0.85
    free = result["decode"]["label_free"]  # two strategies: the base's one greedy guess can be right for about half
    assert free["best_of_k_exact_match"] >= 0.9 and free["base_exact_match"] <= 0.7
    assert free["own_exact_match"] >= 0.9 and free["others_exact_match"] <= 0.1 and free["own_above_others"]
    likelihood = result["likelihood"]  # every example of the split, y teacher-forced under each value
    assert likelihood["measured"] and likelihood["examples"] == result["metrics"]["examples"]
    assert likelihood["log_ratio"] >= 2.0 and likelihood["above_chance"]
    md = write_eval_md(run_dir, result).read_text()
    assert md.startswith(f"## Verdict\n\n**{verdict['outcome']}**") and "| 0 | lead-" in md
    assert "Strategy execution" not in md and "| token-mean NLL (nats) |" in md
    # the labels of the lines each value's decodes reproduce: one per value, so the two values name the strategies
    reproduces = result["decode"]["reproduces"]
    assert sorted(max(r, key=r.get) for r in reproduces.values()) == ["lead-a", "lead-b"]
    assert min(max(r.values()) for r in reproduces.values()) >= 0.9
    assert result["decode"]["decode_strategy_mi"] >= 0.9 * math.log(2) and "I(value; label) over them" in md
    assert result["values"]["trusted"] == [0, 1]


def test_reference_control_by_hand():
    ref = [("a", "e"), ("b", "e"), ("a", "e"), ("b", "e")]
    follows = [[("a", "e"), ("b", "e")], [("a", "e"), ("b", "e")], [("a", "e"), ("b", "e")], [("a", "f"), ("b", "f")]]
    control = reference_control(follows, ref, [0, 1, 0, 1], {0: "lead-a", 1: "lead-b"})
    assert control["exact_match"] == 0.75 and control["chance_exact_match"] == 0.0  # the last decodes "b f"
    assert control["first_token_match"] == 1.0 and control["chance_first_token_match"] == 0.0
    assert control["per_latent"]["1"] == {"strategy": "lead-b", "examples": 2, "exact_match": 0.5,
                                          "chance_exact_match": 0.0, "first_token_match": 1.0,
                                          "chance_first_token_match": 0.0}
    assert control["above_chance"] and control["exact_match_by_latent"] == [0.5, 0.25]
    ignores_z = [[("a", "e")] * 2 for _ in ref]  # the same output under every latent value
    flat = reference_control(ignores_z, ref, [0, 1, 0, 1], {0: "lead-a", 1: "lead-b"})
    assert flat["exact_match"] == flat["chance_exact_match"] == 0.5 and not flat["above_chance"]
    unlabelled = reference_control(ignores_z, ref, [-1] * 4, {})
    assert not unlabelled["measured"] and unlabelled["exact_match_by_latent"] == [0.5, 0.5]


def test_a_trace_of_control_is_not_control():
    """The demo's uniform arm: under the value matched to each strategy the first token is right for 0.484 of
    the examples against 0.469 under the other value, 2.0 SE, at an exact MI of 0.02. Here 2,000 examples, 40 of
    whose first tokens follow the matched value (a gain of 0.02, 6 SE) and nothing else does: a trace that moves
    1 example in 50, which a floor of 0.01 called control."""
    ref = [("a", "e")] * 2000
    outputs = [[("a", "f"), ("b", "f")] if i < 40 else [("b", "f")] * 2 for i in range(2000)]
    control = reference_control(outputs, ref, [0] * 2000, {0: "lead-a", 1: "lead-b"})
    gain = control["first_token_match"] - control["chance_first_token_match"]
    assert gain == pytest.approx(0.02) and gain > 6 * control["first_token_match_gain_se"]
    assert CONTROL_FLOOR > gain and not control["above_chance"]
    strong = [[("a", "f"), ("b", "f")] if i < 2 * 2000 * CONTROL_FLOOR else [("b", "f")] * 2 for i in range(2000)]
    assert reference_control(strong, ref, [0] * 2000, {0: "lead-a", 1: "lead-b"})["above_chance"]


def test_a_z_that_moves_likelihoods_without_flipping_a_decode_is_used():
    """A base that reproduces nothing: every greedy decode is wrong under every latent value, so both decode
    controls see nothing, while y is e times as likely under the value matched to its strategy. The likelihood
    control sees it; likelihoods that differ between the values by as much but independently of the strategy
    (a z that means nothing), that follow it by less than the floor (the uniform cells' tilts of up to 0.33 nats), or
    that follow a matching made by a posterior that knows nothing of the strategy, do not."""
    n, rng = 400, np.random.default_rng(0)
    assigned = np.arange(n) % 2
    matched = np.eye(2, dtype=bool)[assigned]
    follows = np.where(matched, 20.0, 21.0)  # (n, 2) nats: 1 nat less under the matched value
    control = likelihood_control(follows, assigned.tolist(), 0.3)
    assert control["log_ratio"] == pytest.approx(1.0) and control["above_chance"]
    noise = 20.0 + rng.normal(0.0, 1.0, (n, 2))  # as far apart, and unrelated to the label
    assert not likelihood_control(noise, assigned.tolist(), 0.3)["above_chance"]
    tilt = np.where(matched, 20.0, 20.15) + rng.normal(0.0, 0.2, (n, 2))  # 0.15 nats at 10 SE
    trace = likelihood_control(tilt, assigned.tolist(), 0.3)
    assert trace["log_ratio"] == pytest.approx(0.15, abs=0.03) and trace["log_ratio"] > 5 * trace["log_ratio_se"]
    assert not trace["above_chance"] and not likelihood_control(follows, [-1] * n, 0.3)["measured"]
    three = np.array([[5.0, 5.0 + math.log(4), 5.0 + math.log(4) / 2]])  # p(y|k) proportional to 1, 1/4, 1/2
    assert likelihood_control(three, [0], 0.3)["log_ratio"] == pytest.approx(math.log(1 / ((1 / 4 + 1 / 2) / 2)))

    metrics = {"posterior_informative": True, "posterior_values": "exact MI 0.369 nats", "nll_token_mean": 0.418,
               "base_nll_token_mean": 0.44}
    nothing = [[("c",), ("c",)]] * 8  # every decode wrong under both values
    decode = {"reference": reference_control(nothing, [("a",)] * 8, [0, 1] * 4, {0: "copy", 1: "rotate-left"}),
              "label_free": label_free_control(nothing, [("a",)] * 8, [("c",)] * 8, [0, 1] * 4)}
    assert z_use(metrics, decode, "discrete")["outcome"] == "z not used"  # what eval said before
    verdict = z_use(metrics, decode, "discrete", control)
    assert verdict["outcome"] == "z used, decoder whole" and verdict["likelihood_above_chance"]
    assert "1.000 nats more log-likelihood" in verdict["statement"]
    below_floor = z_use(metrics, decode, "discrete", trace)
    assert below_floor["outcome"] == "z not used"
    assert "not above chance, which asks >= 0.693 nats" in below_floor["statement"]
    opposite = likelihood_control(follows, (1 - assigned).tolist(), 0.3)  # the matching the other way round
    assert "1.000 nats less log-likelihood" in z_use(metrics, decode, "discrete", opposite)["statement"]
    # a posterior that knows nothing of the strategy matches values to strategies at random: not counted
    arbitrary = likelihood_control(follows, assigned.tolist(), 0.005)
    assert arbitrary["log_ratio"] == pytest.approx(1.0) and not arbitrary["above_chance"]
    verdict = z_use(metrics, decode, "discrete", arbitrary)
    assert verdict["outcome"] == "z not used" and "I(z; strategy) 0.005 is under 0.01 nats" in verdict["statement"]


class TwoStrategyLabels:
    """s(x) for two strategies: copy and reverse."""

    @staticmethod
    def outputs(x):
        return {"copy": tuple(x), "reverse": tuple(reversed(x))}


def test_strategy_execution_tells_a_strategy_code_from_a_per_input_assignment():
    """Two inputs, two latent values. A code: value 0 copies and 1 reverses on both inputs (coverage 2,
    control accuracy 1). A per-input assignment: value 0 copies on the first input and reverses on the
    second (coverage still 2, control accuracy 0.5). A collapsed z: both values copy (coverage 1). Over the
    decodes, I(value; strategy) is log 2 for the code and 0 for the others; a decode that executes no strategy
    does not count."""
    samples = [Sample(key="a", x=("p", "q"), y=("p", "q")), Sample(key="b", x=("r", "s"), y=("r", "s"))]
    code = [[("p", "q"), ("q", "p")], [("r", "s"), ("s", "r")]]
    per_input = [[("p", "q"), ("q", "p")], [("s", "r"), ("r", "s")]]
    collapsed = [[("p", "q"), ("p", "q")], [("r", "s"), ("r", "s")]]
    result = {name: strategy_execution(samples, outputs, TwoStrategyLabels())[0]
              for name, outputs in (("code", code), ("per_input", per_input), ("collapsed", collapsed))}
    assert [result[n]["coverage"] for n in result] == [2.0, 2.0, 1.0]
    assert [result[n]["control_accuracy"] for n in result] == [1.0, 0.5, 0.5]
    assert result["code"]["coverage_max"] == 2
    assert [result[n]["decode_strategy_mi"] for n in result] == pytest.approx([math.log(2), 0.0, 0.0])
    invalid = [[("p", "q"), ("q", "q")], [("r", "s"), ("s", "r")]]  # value 1's first decode executes neither
    partial = strategy_execution(samples, invalid, TwoStrategyLabels())[0]
    assert partial["executing_share"] == 0.75 and partial["decode_strategy_mi_max"] == pytest.approx(math.log(2))
    # 3 valid decodes: value 0 copies twice, value 1 reverses once: I = H(1/3) - 0
    assert partial["decode_strategy_mi"] == pytest.approx(-(1 / 3) * math.log(1 / 3) - (2 / 3) * math.log(2 / 3))


def test_the_lines_a_value_reproduces_tell_a_strategy_code_from_a_merge():
    """Four labelled lines (each 5 times), two values. Value 0 reproduces the copy lines (a code); value 1 one
    copy line and one reverse line (a merge); a decode that reproduces no line counts for nothing."""
    refs = [("p", "q"), ("r", "s"), ("q", "p"), ("s", "r")] * 5
    strategies = ["copy", "copy", "reverse", "reverse"] * 5
    outputs = [[("p", "q"), ("p", "q")], [("r", "s"), ("x",)], [("p", "q"), ("x",)], [("r", "s"), ("s", "r")]] * 5
    got = reproduction_by_label(outputs, refs, strategies)
    assert got["reproduces"] == {"0": {"copy": 1.0}, "1": {"copy": 0.5, "reverse": 0.5}} and got["reproductions"] == 20
    # I = H(label) - sum_v p(v) H(label | v) = H(1/4, 3/4) - 1/2 log 2
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert got["decode_strategy_mi"] == pytest.approx(h - 0.5 * math.log(2))
    assert got["decode_strategy_mi_max"] == pytest.approx(math.log(2))
    report = value_report([0, 0, 1, 1] * 5, strategies, got["reproduces"], 2)
    assert [r["status"] for r in report["values"].values()] == ["one strategy", "merge"]
    assert reproduction_by_label(outputs, refs, [None] * 20) is None
    # one line reproduced is no evidence: the value's posterior picks (half copy, half reverse) speak for it
    few = reproduction_by_label(outputs[:MIN_REPRODUCTIONS - 1], refs[:MIN_REPRODUCTIONS - 1], strategies)
    assert few["reproduces"] == {"0": None, "1": None}
    assert value_report([0, 1, 0, 1], ["copy", "copy", "reverse", "reverse"], few["reproduces"], 2)["trusted"] == []


def test_label_free_control_by_hand():
    ref = [("a", "e"), ("b", "e")] * 4
    base = [("a", "e")] * 8  # the base always guesses the first strategy: right for half
    diverse = [[("a", "e"), ("b", "e")]] * 8
    free = label_free_control(diverse, ref, base, own_values=[0, 1, 0, 1, 0, 1, 0, 0])
    assert (free["best_of_k_exact_match"], free["base_exact_match"], free["own_exact_match"]) == (1.0, 0.5, 0.875)
    assert free["others_exact_match"] == 0.125 and free["diverse_share"] == 1.0
    assert free["own_above_others"]  # gain 0.75 > 2 SE = 0.5
    assert not label_free_control(diverse[:4], ref[:4], base[:4], [0, 1, 0, 0])["own_above_others"]  # 2 SE = 1.0
    z_free = label_free_control([[r, r] for r in ref], ref, base, own_values=[0] * 8)  # beats the base, ignores z
    assert z_free["best_of_k_exact_match"] == 1.0 > z_free["base_exact_match"] and not z_free["own_above_others"]
    same = label_free_control([[("a", "e")] * 2] * 8, ref, base, own_values=[0, 1] * 4)
    assert same["best_of_k_exact_match"] == 0.5 and same["diverse_share"] == 0.0 and not same["own_above_others"]


def test_a_decoder_whose_outputs_move_with_z_meaning_nothing_is_not_called_used():
    """The K = 4 uniform cells of the defaults table: decodes differ between latent values on a third of the
    examples without meaning anything, so best of K beats the mean of the values (0.21 against 0.18, 3.9 SE)
    while the posterior's own value does no better than the others. Here: every reference is "a"; value 0
    decodes it on even examples, value 1 on odd ones, and the posterior always picks value 0."""
    ref = [("a",)] * 40
    noisy = [[("a",), ("c",)] if i % 2 == 0 else [("c",), ("a",)] for i in range(40)]
    free = label_free_control(noisy, ref, [("c",)] * 40, own_values=[0] * 40)
    assert free["best_of_k_exact_match"] == 1.0 > free["mean_exact_match"] == 0.5
    assert free["own_exact_match"] == free["others_exact_match"] == 0.5 and not free["own_above_others"]
    metrics = {"posterior_informative": True, "posterior_values": "exact MI 0.017 nats", "nll_token_mean": 0.3,
               "base_nll_token_mean": 0.4}
    unlabelled = {"measured": False, "reason": "no labels"}
    assert z_use(metrics, {"reference": unlabelled, "label_free": free}, "discrete")["outcome"] == "z not used"


def constructed(informative=True, nll=0.05, base_nll=0.04, own=0.9, base=0.5, best=1.0, others=0.3, labels_above=None):
    """(metrics, decode) as eval would measure them, every figure given."""
    metrics = {"posterior_informative": informative, "posterior_values": "exact MI 0.6 nats",
               "nll_token_mean": nll, "base_nll_token_mean": base_nll}
    free = {"own_exact_match": own, "base_exact_match": base, "best_of_k_exact_match": best, "diverse_share": 1.0,
            "others_exact_match": others, "own_above_others": own - others >= 0.1}
    reference = {"measured": False, "reason": "no labels"} if labels_above is None else {
        "measured": True, "above_chance": labels_above, "exact_match": own, "chance_exact_match": 0.1,
        "first_token_match": own, "chance_first_token_match": 0.1}
    return metrics, {"reference": reference, "label_free": free}


@pytest.mark.parametrize("case, outcome", [
    (dict(), "z used, decoder whole"),
    (dict(labels_above=True), "z used, decoder whole"),
    (dict(labels_above=False), "z used, decoder whole"),  # arbitrary labels: the label-free control decides
    (dict(nll=0.10), "z used, decoder damaged"),  # 0.06 nats per token worse than the base
    (dict(own=0.4), "z used, decoder damaged"),  # its own latent value reproduces less than the base's guess
    (dict(own=0.0, best=0.0, nll=2.4, base_nll=0.05, labels_above=True),  # the demo's decoder of before: first
     "z used, decoder damaged"),  # tokens follow the strategy (above chance), no reference reproduced
    (dict(own=0.0, best=0.0, nll=2.4, base_nll=0.05), "z not used"),  # the same without labels: nothing shows z
    (dict(own=0.3, labels_above=False), "z not used"),  # no decode shows z, labelled or not
    (dict(informative=False), "z not used"),
])
def test_the_verdict_on_constructed_metrics(case, outcome):
    metrics, decode = constructed(**case)
    verdict = z_use(metrics, decode, "discrete")
    assert verdict["outcome"] == outcome and verdict["statement"].startswith(outcome + ":")
    assert verdict["used"] == (outcome != "z not used")
    assert (verdict["used"] and verdict["whole"]) == (outcome == "z used, decoder whole")


def test_a_damaged_decoder_is_never_whole():
    for nll in (0.0501 + 0.04, 0.5, 2.41):
        for own, base in ((1.0, 0.5), (0.49, 0.5), (0.0, 0.0)):
            verdict = z_use(*constructed(nll=nll, own=own, base=base), "discrete")
            assert not verdict["whole"] and verdict["outcome"] != "z used, decoder whole"
    unmeasured = z_use(constructed()[0], {}, "discrete")  # nothing decoded: never called whole
    assert unmeasured["used"] and not unmeasured["whole"]


def records(post, labels, logvar=None) -> EvalRecords:
    rec, n = EvalRecords(), len(labels)
    zeros = torch.zeros(n)
    rec.add(zeros, zeros, zeros, torch.as_tensor(post), labels, zeros,
            None if logvar is None else torch.as_tensor(logvar))
    return rec


def test_a_flat_posterior_marks_strategy_nmi_and_accuracy_not_informative():
    labels = ["copy", "rot"] * 50
    onehot = np.eye(2)[[0, 1] * 50]
    nearly_uniform = 0.5 + 0.001 * (onehot - 0.5)  # argmax follows the label, q carries ~nothing
    metrics = records(nearly_uniform, labels).finalize("discrete", 2)
    assert metrics["strategy_nmi"] == pytest.approx(1.0) and metrics["mi"] < 1e-5  # a number that looks good
    assert not metrics["posterior_informative"] and metrics["posterior_values"].startswith("exact MI 0.0000")
    verdict = z_use(metrics, {}, "discrete")
    assert not verdict["used"] and verdict["posterior_rule"] == "exact MI >= 0.01 nats"
    for name in ("strategy_nmi", "strategy_accuracy"):
        assert verdict[name].startswith("not informative (posterior flat: exact MI 0.0000 nats; rule: exact MI >= 0.01")
    assert "| strategy_nmi | not informative" in eval_markdown(metrics, {}, verdict)
    sharp = records(onehot, labels).finalize("discrete", 2)
    assert sharp["posterior_informative"] and z_use(sharp, {}, "discrete")["strategy_nmi"] == pytest.approx(1.0)


def test_a_collapsed_continuous_posterior_is_flat_whatever_k_means_finds():
    labels = ["copy", "rot"] * 50
    mu = 1e-3 * (np.eye(2)[[0, 1] * 50] - 0.5)  # two tight clusters, by label, of almost no spread
    metrics = records(mu, labels, np.zeros_like(mu)).finalize("continuous", 2)
    assert metrics["strategy_nmi"] == pytest.approx(1.0) and metrics["strategy_accuracy"] == 1.0
    assert metrics["active_units"] == 0 and metrics["mi_estimate"] < 0.01 and not metrics["posterior_informative"]
    assert z_use(metrics, {}, "continuous")["strategy_accuracy"].startswith("not informative (posterior flat: 0 active")
    apart = records(10 * (np.eye(2)[[0, 1] * 50] - 0.5), labels, np.full_like(mu, -4.0)).finalize("continuous", 2)
    assert apart["active_units"] == 2 and apart["mi_estimate"] == pytest.approx(math.log(2), abs=1e-3)
    assert apart["posterior_informative"]


def test_gaussian_mi_against_hand_computations():
    n = 400
    mu = np.repeat([[-10.0], [10.0]], n // 2, axis=0)  # two well-separated posteriors, half the examples each
    mi, se = gaussian_mi(mu, np.zeros_like(mu), seed=0)
    assert mi == pytest.approx(math.log(2), abs=1e-6) and se < 1e-6
    same, se_same = gaussian_mi(np.zeros((n, 3)), np.zeros((n, 3)), seed=0)
    assert same == pytest.approx(0.0, abs=1e-12) and se_same == pytest.approx(0.0, abs=1e-12)
    # overlapping: q = N(-1, 1) or N(+1, 1); I = H(mixture) - H(N(0, 1)) by quadrature
    mu = np.repeat([[-1.0], [1.0]], 2000, axis=0)
    z = np.linspace(-12, 12, 200001)
    mix = 0.5 * (np.exp(-0.5 * (z + 1) ** 2) + np.exp(-0.5 * (z - 1) ** 2)) / math.sqrt(2 * math.pi)
    exact = -np.sum(mix * np.log(mix)) * (z[1] - z[0]) - 0.5 * math.log(2 * math.pi * math.e)
    mi, se = gaussian_mi(mu, np.zeros_like(mu), seed=0)
    assert abs(mi - exact) < 4 * se and 0 < se < 0.02 and gaussian_mi(mu, np.zeros_like(mu), seed=0) == (mi, se)
    assert gaussian_mi(mu, np.zeros_like(mu), seed=1) != (mi, se)  # the seed draws the samples
