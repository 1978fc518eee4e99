import json
import math

import numpy as np
import pytest
import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.pipeline.data.labels import load_labels
from tests.support.fixtures_train import two_regime_samples
from tokweight.report.eval_md import write_eval_md
from tokweight.training.config.components import CVAEConfig
from tokweight.training.cvae.model import build_cvae
from tokweight.training.config.use import EvalConfig
from tokweight.training.evaluation.evaluate import greedy_decode, latent_values, run_eval
from tokweight.training.evaluation.metrics import contingency, exact_mi, hungarian_accuracy, nmi
from tokweight.training.loop.train import run
from tokweight.training.config.train import IOConfig, LossConfig, OptimConfig, TrainConfig


@pytest.mark.parametrize("cond", ["token", "prefix", "layernorm", "memory"])
def test_greedy_decode_per_latent_follows_the_base_model(two_regime, cond):
    _, ckpt_dir = two_regime
    ckpt = load_checkpoint(ckpt_dir)
    torch.manual_seed(0)  # the pathway's new heads draw from the global generator: whatever tests ran before
    model = build_cvae(ckpt.model, ckpt.vocab, CVAEConfig(k=2, cond=cond, slots=2 if cond == "prefix" else 1)).eval()
    samples = two_regime_samples(6, seed=5, max_x=4)
    z, slot_ids = latent_values(model, None)
    out = greedy_decode(model, ckpt.vocab, samples, z, slot_ids, max_new=15)
    assert len(out) == 12  # example-major, 2 latent values each
    for y in out:  # the suffix is certain; the two strategy tokens are one of the options
        assert y[2:] == ("e",) * 10 and y[0] in "ab" and y[1] in "cd", y


def test_eval_writes_json_and_its_markdown_renders(tiny, tmp_path):
    data, ckpt = tiny
    run(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), out=str(tmp_path / "run"), num_workers=0),
                    cvae=CVAEConfig(latent="continuous", z_dim=2), loss=LossConfig(policy="frozen"),
                    optim=OptimConfig(steps=2, batch_size=8)))
    result = run_eval(EvalConfig(run=str(tmp_path / "run"), data=str(data), split="test", decode_examples=16))
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert saved["metrics"]["examples"] == 128 and "active_units" in saved["metrics"]
    assert result["metrics"] == saved["metrics"] and result["split"] == "test"
    assert saved["decode"]["latent_values"] == 4 and 0.0 <= saved["decode"]["control_accuracy"] <= 1.0
    assert set(saved["decode"]["executes"]["0"]) == {"copy", "reverse", "sort", "sort-desc", "none"}
    md = write_eval_md(tmp_path / "run", saved).read_text()  # from eval.json read back: plain data suffices
    assert "| strategy_nmi |" in md and md.startswith("## Verdict\n\n**z not used**\n\nz not used: ")
    assert 0.0 <= saved["decode"]["decode_strategy_mi"] <= np.log(4) + 1e-9
    assert f"execute one: {saved['decode']['decode_strategy_mi']:.3f} nats (" in md
    assert saved["z_used"]["outcome"] == "z not used"
    metrics = saved["metrics"]  # the continuous MI estimate with its SE, and the rule it is judged by
    assert metrics["mi_estimate"] >= 0 and metrics["mi_estimate_se"] >= 0
    assert "MI estimate" in metrics["posterior_values"]
    assert saved["z_used"]["used"] is False  # two steps: the posterior is still flat
    control = saved["decode"]["reference"]  # synth data: the reference check as well as the execution check
    assert control["measured"] and control["examples"] + control["unassigned"] == 16
    outputs = load_labels(data).outputs
    assert outputs(("c", "a", "b"))["sort"] == ("a", "b", "c")


def test_information_metrics_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert exact_mi(q) == pytest.approx(np.log(2))
    assert exact_mi(np.full((3, 2), 0.5)) == pytest.approx(0.0)
    table, names = contingency(["x", "y", "x", "y"], np.array([1, 0, 1, 0]))
    assert names == ["x", "y"] and nmi(table) == pytest.approx(1.0) and hungarian_accuracy(table) == 1.0
    table, _ = contingency(["x", "y", "x", "y"], np.array([0, 0, 1, 1]))
    assert nmi(table) == pytest.approx(0.0, abs=1e-12) and hungarian_accuracy(table) == 0.5


def test_strategy_mi_counts_only_information_about_the_strategy():
    from tokweight.training.evaluation.metrics import strategy_mi

    code = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert strategy_mi(code, ["copy", "rot", "copy", "rot"]) == pytest.approx(math.log(2))
    assert strategy_mi(code, ["copy", "copy", "rot", "rot"]) == pytest.approx(0.0, abs=1e-12)  # a code of x
    assert exact_mi(code) == pytest.approx(math.log(2))  # which exact I(z; x,y) counts in full
    soft = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    assert 0 < strategy_mi(soft, ["a", "b", "a"]) <= exact_mi(soft) + 1e-12
