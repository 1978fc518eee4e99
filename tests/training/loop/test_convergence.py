"""The stop rule (training/loop/convergence.py) on constructed validations, where it starts counting, and the
train command's line saying why a run stopped."""

import json
import os

import pytest
from click.testing import CliRunner

from tokweight.training.loop.convergence import Convergence, StopRule, converged, observe, val_mi, val_objective
from tokweight.training.objective.estep import EStepConfig
from tokweight.commands.train import train
from tokweight.training.objective.schedules import Schedule
from tokweight.training.config.train import IOConfig, LossConfig, TrainConfig

RULE = StopRule(patience=2, min_delta_objective=0.1, min_delta_mi=0.1)


def readings(rule: StopRule, points) -> list[Convergence]:
    """The state after each (step, objective, MI)."""
    state, out = Convergence(), []
    for step, objective, mi in points:
        state = observe(state, rule, step, objective, mi)
        out.append(state)
    return out


def test_an_improvement_of_either_number_by_more_than_its_delta_resets_the_count():
    states = readings(RULE, [(100, 2.0, 0.5),   # the first counted validation sets both bests
                             (150, 1.95, 0.55),  # both better, by less than their deltas: stale
                             (200, 1.85, 0.5),   # the objective 0.15 below its best: improved
                             (250, 1.9, 0.65),   # the MI 0.15 above its best: improved
                             (300, 1.9, 0.6),
                             (350, 1.8, 0.7)])  # neither by more than 0.1: stale again
    assert [s.stale for s in states] == [0, 1, 0, 0, 1, 2]
    assert [s.best_step for s in states] == [100, 100, 200, 250, 250, 250]
    assert (states[-1].best_objective, states[-1].best_mi) == (1.85, 0.65)
    assert [converged(s, RULE) for s in states] == [False] * 5 + [True]


def test_slow_progress_adds_up_to_an_improvement():
    states = readings(RULE, [(step, 2.0 - 0.06 * i, 0.0) for i, step in enumerate(range(0, 250, 50))])
    assert [s.stale for s in states] == [0, 1, 0, 1, 0]  # 0.12 below the best after two validations


def test_patience_zero_never_stops():
    off = StopRule(patience=0)
    assert not converged(readings(off, [(s, 1.0, 0.0) for s in range(0, 1000, 50)])[-1], off)
    assert off.describe(50, 256, 0.3, 100).startswith("off")
    with pytest.raises(ValueError):
        StopRule(patience=-1)


def test_the_rule_reads_the_objective_and_the_mi_a_validation_reports():
    assert val_objective({"recon": 1.0, "kl": 0.5}, beta=0.3) == 1.15
    assert val_mi({"mi": 0.7, "mi_estimate": 0.1}) == 0.7  # discrete: the exact MI
    assert val_mi({"mi_estimate": 0.4}) == 0.4  # continuous: the Monte Carlo estimate
    words = RULE.describe(eval_every=50, examples=256, beta=0.3, settle=100)
    assert all(part in words for part in ("2 consecutive validations", "every 50 steps", "256 val examples",
                                          "from step 100", "recon + 0.3 * KL", "0.1 nats"))


def settled(cfg: TrainConfig) -> int:
    return Schedule.of(cfg).settled_from


def test_validations_count_once_the_objective_stops_changing(tmp_path):
    io = IOConfig(checkpoint="c", data="d", out=str(tmp_path), store="s")
    warm = LossConfig(beta=0.3, beta_warmup_steps=100)
    assert settled(TrainConfig(io, loss=warm)) == 100  # the anchor starts with the warm-up's end
    assert settled(TrainConfig(io, loss=LossConfig(beta=warm.beta, anchor_start_step=150))) == 150
    assert settled(TrainConfig(io, loss=LossConfig(beta=warm.beta, anchor_weight=0.0, anchor_start_step=150))) == 100
    warm_start = EStepConfig(mode="label", until_step=300)
    assert settled(TrainConfig(io, loss=warm, estep=warm_start)) == 300


def test_train_says_why_it_stopped(tiny, tmp_path):
    data, ckpt = tiny
    result = CliRunner().invoke(train, ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(tmp_path / "run"),
                                        "--policy", "frozen", "--steps", "3", "--batch-size", "8", "--warmup-steps",
                                        "1", "--eval-every", "1", "--patience", "1", "--lr-decay", "0.3",
                                        "--num-workers", "0", "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["stop"]
    # counted from step 1; patience 1: the run stops at the first validation that does not improve
    assert last["reason"] in ("converged", "step cap") and last["step"] <= 3
    assert f"stopped at step {last['step']}: {last['reason']}" in result.output
    assert "1 consecutive validations (every 1 steps" in last["rule"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["optim"]["stop"]["patience"] == 1 and config["log"]["eval_every"] == 1
    # the last round(0.3 * 3) = 1 step falls, unless the run converged first and fell from there
    assert config["optim"]["lr_decay"] == 0.3
    assert f"lr fell to 0 over steps {last['lr_decay'][0]}-{last['step']}" in result.output


def test_a_run_resumes_whatever_its_paths_are_spelt_as(tiny, tmp_path, monkeypatch):
    """The run's config records absolute paths, so the same run named relative to another working directory
    is resumed, not refused as another config."""
    data, ckpt = tiny
    common = ["--policy", "frozen", "--steps", "2", "--batch-size", "8", "--num-workers", "0", "--device", "cpu",
              "--threads", "1", "--log-every", "1", "--ckpt-every", "1"]
    first = CliRunner().invoke(train, ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(tmp_path / "run"),
                                       *common])
    assert first.exit_code == 0, first.output
    monkeypatch.chdir(tmp_path)
    again = CliRunner().invoke(train, ["--checkpoint", os.path.relpath(ckpt), "--data", os.path.relpath(data),
                                       "--out", "run", *common[:3], "3", *common[4:]])
    assert again.exit_code == 0, again.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["io"]["out"] == str(tmp_path / "run") and config["io"]["data"] == str(data.resolve())
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [0, 1, 2]  # resumed at step 2, not started again
