import json
import math
from dataclasses import replace

import pytest
import torch

from tokweight.pipeline.models.checkpoint import load_checkpoint
from tokweight.training.config.migrations import train_config_from
from tokweight.training.config.components import CVAEConfig, EStepConfig
from tokweight.training.cvae.model import build_cvae, spread_latent_embeddings, token_row_spread
from tokweight.experiments.recipes import recipe_overrides, with_recipe
from tokweight.training.loop.run_dir import load_run
from tokweight.training.objective.schedules import Schedule
from tokweight.training.loop.train import run
from tokweight.training.config.train import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig


def config(tiny, out, beta=1.0, weighting="surprisal-share", **groups):
    data, ckpt = tiny
    base = dict(io=IOConfig(checkpoint=str(ckpt), data=str(data), out=str(out), num_workers=0),
                loss=LossConfig(policy="frozen", weighting=weighting, beta=beta),
                optim=OptimConfig(steps=4, batch_size=8),
                log=LogConfig(log_every=1, grad_diag_every=2, ckpt_every=4, eval_batch_size=64, eval_every=2,
                              eval_examples=32))
    return TrainConfig(**{**base, **groups})


VARIANTS = {
    "estep-hard-balanced": dict(estep=EStepConfig(mode="hard", balance_iters=3)),
    "estep-soft-learned-prior-warm-start": dict(estep=EStepConfig(mode="soft", temperature=0.5, follow_beta=False,
                                                                  prior="learned", until_step=2)),
    "plain-objective-latent-rows-replaced": dict(estep=EStepConfig(mode="off"),
                                                 cvae=CVAEConfig(latent_init_norm=3.0, latent_init_center=False)),
    "default": {},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_short_run_per_variant_gives_finite_metrics(tiny, tmp_path, name):
    cfg = config(tiny, tmp_path / name, beta=0.1, **VARIANTS[name])
    result = run(cfg)
    assert 0 <= result["mi"] <= math.log(cfg.cvae.k) + 1e-9 and math.isfinite(result["recon"])
    recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "loss" in r]
    assert len(train) == 4 and all(math.isfinite(r["loss"]) and math.isfinite(r["R_spread_weighted"]) for r in train)
    assert [r["estep"] for r in train] == [Schedule.of(cfg).at(s).em for s in range(4)]
    assert [r["step"] for r in recs if r.get("split") == "val"] == [2, 4]  # periodic, then the final one
    assert train_config_from(json.loads((tmp_path / name / "config.json").read_text())) == cfg
    load_run(tmp_path / name)  # the run's model rebuilds from its config


def test_spread_latent_embeddings_are_orthogonal_with_the_given_norm(tiny):
    ckpt = load_checkpoint(tiny[1])
    ids = [ckpt.vocab.latent_id(k) for k in range(4)]
    spread_latent_embeddings(ckpt.model, ids, 2.5, torch.Generator().manual_seed(0))
    E = ckpt.model.wte.weight[ids].detach()
    assert torch.allclose(E @ E.T, 6.25 * torch.eye(4), atol=1e-4)


def test_recipes_set_only_how_the_latent_is_learnt(tiny, tmp_path):
    cfg = config(tiny, tmp_path, weighting="uniform", beta=0.3)
    plain = with_recipe(cfg, "baseline")
    assert plain.estep.mode == "off" and plain.cvae.latent_init_norm == 0.0
    assert replace(plain, estep=cfg.estep, cvae=cfg.cvae) == cfg  # nothing but the recipe's fields moved
    assert with_recipe(cfg, "default") == cfg
    with pytest.raises(ValueError, match="no recipes preset 'magic'"):
        with_recipe(cfg, "magic")
    assert set(recipe_overrides("survival")) == {"estep.mode", "estep.until_step", "cvae.latent_init_norm",
                                                 "cvae.latent_init_center", "cvae.posterior_pool"}
    nudged = with_recipe(cfg, "default", {"cvae.latent_init_norm": 0.7})  # a cell's own override
    assert nudged.cvae.latent_init_norm == 0.7


def test_frozen_baseline_keeps_the_checkpoint_rows_when_latent_embeddings_are_re_initialised(tiny, tmp_path):
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.objective.baselines import Frozen
    from tokweight.training.loop.stream import EvalStream, loader
    from tokweight.training.loop.setup import setup

    state = setup(config(tiny, tmp_path, cvae=CVAEConfig(latent_init_norm=3.0, latent_init_center=False)), Ranks())
    batch = next(iter(loader(EvalStream(state.spec), 0)))
    reference = Frozen(load_checkpoint(tiny[1]).model)(batch)
    assert torch.equal(state.baseline(batch, None), reference)
    ids = state.model.latent.latent_ids
    assert not torch.equal(state.model.backbone.wte.weight[ids], load_checkpoint(tiny[1]).model.wte.weight[ids])


def test_train_with_only_the_required_flags_builds_the_default_config(tiny, tmp_path):
    """`tokweight train --checkpoint --data --store --out` is TrainConfig's defaults: the recipe that keeps z."""
    from click.testing import CliRunner

    from tokweight.commands.train import train

    data, ckpt = tiny
    out = tmp_path / "cli"
    args = ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--policy", "frozen"]
    result = CliRunner().invoke(train, args + ["--steps", "2", "--batch-size", "4", "--num-workers", "0"])
    assert result.exit_code == 0, result.output
    saved = train_config_from(json.loads((out / "config.json").read_text()))
    assert saved == TrainConfig(io=saved.io, loss=LossConfig(policy="frozen"), optim=OptimConfig(steps=2, batch_size=4))
    assert (saved.cvae.cond, saved.cvae.slots, saved.cvae.posterior_pool) == ("query", 1, "mean")
    assert saved.estep == EStepConfig(mode="soft", follow_beta=True, prior="uniform", harden=0.5, harden_from=None,
                                      cluster_weight=3.0)
    assert (saved.cvae.latent_init_norm, saved.cvae.latent_init_center) == (0.5, True)
    assert (saved.loss.beta, saved.loss.beta_warmup_steps, saved.optim.lr) == (0.3, 100, 3e-4)
    assert Schedule.of(saved).at(99).anchor_weight == 0.0 and Schedule.of(saved).at(100).anchor_weight == 1.0
    assert saved.io.device == "auto"
    removed = CliRunner().invoke(train, args + ["--recipe", "baseline"])
    assert removed.exit_code != 0 and "No such option '--recipe'" in removed.output


def test_survival_recipe_warm_starts_on_the_true_strategy(tiny, tmp_path):
    from tokweight.pipeline.ranks import Ranks
    from tokweight.pipeline.data.synth import load_synth_config
    from tokweight.training.loop.setup import label_names, setup

    cfg = with_recipe(config(tiny, tmp_path, weighting="uniform", beta=0.3), "survival")
    assert cfg.estep.mode == "label" and cfg.cvae.latent_init_center
    assert cfg.cvae.posterior_pool == "mean"
    state = setup(cfg, Ranks())
    assert state.strategy_names == tuple(load_synth_config(tiny[0]).strategies)
    ckpt = load_checkpoint(tiny[1])
    weight = ckpt.model.wte.weight.detach()
    before = weight[state.model.latent.latent_ids]
    every_latent = torch.tensor([ckpt.vocab.latent_id(k) for k in range(ckpt.vocab.k_max)])
    spread = token_row_spread(weight, every_latent, chunk_rows=5)  # in which the recipe's norm 1 is given
    keep = torch.ones(len(weight), dtype=torch.bool)
    keep[every_latent] = False
    rows = weight[keep].double()
    assert spread == pytest.approx((rows - rows.mean(0)).norm(dim=1).pow(2).mean().sqrt().item(), rel=1e-9)
    offsets = state.model.backbone.wte.weight[state.model.latent.latent_ids].detach() - before.mean(0)
    assert torch.allclose(offsets.norm(dim=1), torch.full((len(offsets),), spread), atol=1e-5)  # mean row + offsets
    assert torch.allclose(offsets @ before.mean(0), torch.zeros(len(offsets)), atol=1e-5)
    (tmp_path / "foreign").mkdir()
    with pytest.raises(ValueError, match="foreign/dataset.json"):
        label_names(replace(cfg, io=replace(cfg.io, data=str(tmp_path / "foreign"))))
    with pytest.raises(ValueError, match="latent_init_norm must be >= 0"):
        CVAEConfig(latent_init_norm=-1.0)


def test_the_continuous_latent_gets_spread_slots_the_hard_e_step_over_its_draws_and_one_start_by_default(tiny,
                                                                                                        tmp_path):
    cfg = config(tiny, tmp_path, cvae=CVAEConfig(latent="continuous"))
    assert cfg.estep == EStepConfig(mode="hard", follow_beta=True, prior="learned", harden=0.0, harden_from=800,
                                    cluster_weight=0.0)
    assert (cfg.cvae.latent_init_norm, cfg.cvae.latent_init_center) == (1.0, True)
    assert (cfg.cvae.cond, cfg.cvae.z_dim, cfg.cvae.samples) == ("prefix", 2, 4)
    assert config(tiny, tmp_path).estep.mode == "soft"
    assert (cfg.optim.starts, config(tiny, tmp_path).optim.starts) == (1, 3)  # resolved, so config.json says it
    named = config(tiny, tmp_path, cvae=CVAEConfig(latent="continuous"), optim=OptimConfig(steps=4, starts=3))
    assert named.optim.starts == 3 and train_config_from(named.to_json()) == named


def test_cli_anchor_term_is_trained_and_logged(tiny, tmp_path):
    """--anchor-weight trains with the logged anchor term; it starts at the end of beta's warm-up."""
    from click.testing import CliRunner

    from tokweight.commands.train import train

    data, ckpt = tiny
    out = tmp_path / "cli"
    args = ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--policy", "frozen", "--steps", "2",
            "--batch-size", "4", "--num-workers", "0", "--beta", "0.3", "--warmup-steps", "1", "--cond", "prefix", "--slots", "2",
            "--anchor-weight", "2", "--log-every", "1"]
    result = CliRunner().invoke(train, args)
    assert result.exit_code == 0, result.output
    saved = train_config_from(json.loads((out / "config.json").read_text()))
    assert saved.cvae.slots == 2 and saved.estep.follow_beta
    assert [Schedule.of(saved).at(s).anchor_weight for s in (0, 1)] == [0.0, 2.0]
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert all(r["anchor"] >= 0 and math.isfinite(r["anchor"]) and r["l_t0_spread"] >= 0 for r in recs)
    with pytest.raises(ValueError, match="anchor"):
        LossConfig(anchor_weight=-1.0)
    late = Schedule.of(replace(saved, loss=LossConfig(policy="frozen", anchor_weight=2.0, anchor_start_step=3)))
    assert [late.at(s).anchor_weight for s in (0, 2, 3, 9)] == [0.0, 0.0, 2.0, 2.0]


def test_train_labelled_sets_the_default_e_steps_share_and_refuses_a_bad_one(tiny, tmp_path):
    from click.testing import CliRunner

    from tokweight.commands.train import train

    data, ckpt = tiny
    args = ["--checkpoint", str(ckpt), "--data", str(data), "--policy", "frozen", "--steps", "2", "--batch-size", "4",
            "--num-workers", "0"]
    result = CliRunner().invoke(train, args + ["--out", str(tmp_path / "a"), "--labelled", "0.2"])
    assert result.exit_code == 0, result.output
    saved = train_config_from(json.loads((tmp_path / "a" / "config.json").read_text()))
    assert saved.estep == EStepConfig(mode="soft", follow_beta=True, prior="uniform", labelled=0.2, harden=0.5,
                                       harden_from=None, cluster_weight=3.0)
    for bad, message in ((["--labelled", "1.5"], "labelled must be a share in [0, 1]"),
                         (["--labelled", "0.2", "--latent", "continuous"], "labelled 0")):
        refused = CliRunner().invoke(train, args + ["--out", str(tmp_path / "b")] + bad)
        assert refused.exit_code != 0 and message in refused.output and "Traceback" not in refused.output


def test_train_refuses_a_hardening_every_example_reaches_in_one_line(tiny, tmp_path):
    from click.testing import CliRunner

    from tokweight.commands.train import train

    data, ckpt = tiny
    args = ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(tmp_path / "run"), "--policy", "frozen",
            "--steps", "2", "--batch-size", "4", "--num-workers", "0", "--k", "2"]
    refused = CliRunner().invoke(train, args + ["--set", "estep.harden=0.5"])
    assert refused.exit_code != 0 and "harden 0.5 is at most 1/k = 0.5" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "run" / "checkpoint").exists()
    result = CliRunner().invoke(train, args)  # k = 2's default: no hardening
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["estep"]["harden"] == 0.0


def test_labelled_examples_reach_the_e_step_as_their_strategies_index(tiny, tmp_path, monkeypatch):
    from tokweight.pipeline.data.synth import load_synth_config
    from tokweight.training.objective import estep

    cfg = config(tiny, tmp_path)
    cfg = replace(cfg, estep=replace(cfg.estep, labelled=1.0))
    names = tuple(load_synth_config(tiny[0]).strategies)
    seen, real = [], estep.strategy_indices
    monkeypatch.setattr(estep, "strategy_indices", lambda s, n, k: seen.append((list(s), n)) or real(s, n, k))
    run(replace(cfg, optim=replace(cfg.optim, steps=2)))
    assert len(seen) == 2 and all(n == names for _, n in seen)  # every example of both steps, in the data's order
    assert sum(map(len, (s for s, _ in seen))) == 2 * cfg.optim.batch_size
    assert json.loads((tmp_path / "config.json").read_text())["estep"]["labelled"] == 1.0
