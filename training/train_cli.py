"""`tokweight train` and `tokweight eval`: build the config, call run. Heavy imports stay inside."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click


def echo_skips(result: dict) -> None:
    """The one stderr line saying which samples the run left out, if it left any out."""
    from tokweight.pipeline.errors import Skips

    if line := Skips(result.get("skipped_shards")).summary_line():
        click.echo(line, err=True)


@click.command("train")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), required=True,
              help="Entangled checkpoint to initialise the CVAE from.")
@click.option("--data", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--store", type=click.Path(file_okay=False), default=None, help="Baseline store root.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Run directory (resumed if present).")
@click.option("--latent", type=click.Choice(["discrete", "continuous"]), default="discrete")
@click.option("--k", type=int, default=4, help="Latent values (discrete); clusters for continuous evaluation.")
@click.option("--z-dim", type=int, default=8, help="Continuous latent dimensions.")
@click.option("--prior", type=click.Choice(["learned", "standard"]), default="learned", help="Continuous prior.")
@click.option("--cond", type=click.Choice(["token", "prefix", "layernorm"]), default="token", help="z pathway.")
@click.option("--slots", type=int, default=1, help="Latent slots (prefix only).")
@click.option("--weighting", type=click.Choice(["uniform", "sum", "surprisal-share", "inverse-surprisal",
                                                "example-inverse", "distribution-rescale"]),
              default="surprisal-share")
@click.option("--token-weighted-reconstruction-weight", "lam", type=float, default=1.0,
              help="lambda in (1 - lambda) * uniform + lambda * weighting.")
@click.option("--policy", type=click.Choice(["precomputed", "frozen", "dynamic"]), default="precomputed")
@click.option("--baseline-checkpoint", type=click.Path(exists=True, file_okay=False), default=None,
              help="Checkpoint b came from (default: --checkpoint).")
@click.option("--beta", type=float, default=1.0)
@click.option("--beta-schedule", type=click.Choice(["constant", "linear", "cyclical"]), default="constant")
@click.option("--warmup-steps", type=int, default=0, help="Linear schedule: steps from 0 to beta.")
@click.option("--cycles", type=int, default=4, help="Cyclical schedule: M.")
@click.option("--ramp-ratio", type=float, default=0.5, help="Cyclical schedule: R.")
@click.option("--free-bits", type=float, default=0.0, help="KL floor in nats (< log K for discrete).")
@click.option("--anchor-weight", type=float, default=0.0,
              help="Weight of the anchor term E_q mean_t relu(l_t(z) - b_t - margin): no token worse than the base.")
@click.option("--anchor-margin", type=float, default=0.0, help="Nats a token may rise above b_t before the anchor acts.")
@click.option("--anchor-start-step", type=int, default=0, help="Steps before the anchor term acts (after z is found).")
@click.option("--recipe", default="baseline", show_default=True,
              help="Named remedy preset (training/recipes.py); the flags below override its fields.")
@click.option("--estep", type=click.Choice(["off", "soft", "hard", "label"]), default=None,
              help="E-step from the decoder's K passes (discrete); label: the true strategy (synthetic data).")
@click.option("--estep-temperature", type=float, default=None, help="Soft E-step temperature (= beta: exact).")
@click.option("--estep-prior", type=click.Choice(["uniform", "learned"]), default=None)
@click.option("--estep-balance-iters", type=int, default=None, help="Sinkhorn iterations (0: unbalanced).")
@click.option("--estep-until", type=int, default=None, help="E-step for the first N steps only (0: always).")
@click.option("--latent-embedding-norm", type=float, default=None,
              help="Re-initialise the K latent embeddings orthogonal with this norm (0: keep).")
@click.option("--latent-embedding-center/--no-latent-embedding-center", default=None,
              help="Offset those rows from the checkpoint's mean latent row (the decoder starts intact).")
@click.option("--aggressive-steps", type=int, default=None, help="He et al. 2019 inner posterior steps (0: off).")
@click.option("--aggressive-until", type=int, default=None, help="Training steps with aggressive updates.")
@click.option("--posterior-encoder", type=click.Choice(["shared", "separate"]), default=None)
@click.option("--posterior-pool", type=click.Choice(["last", "mean"]), default=None,
              help="What the posterior reads: the <eos> state, or the mean of the states that predict S.")
@click.option("--steps", type=int, default=300)
@click.option("--batch-size", type=int, default=32, help="Per rank.")
@click.option("--lr", type=float, default=1e-3)
@click.option("--num-workers", type=int, default=1)
@click.option("--lanes", type=int, default=None,
              help="Sample streams of the global batch (default: one per rank); the data order depends on it.")
@click.option("--on-bad-sample", type=click.Choice(["error", "skip"]), default="error",
              help="A bad sample the store does not record as skipped: stop naming it, or skip and count it.")
@click.option("--log-every", type=int, default=10)
@click.option("--grad-diag-every", type=int, default=50)
@click.option("--ckpt-every", type=int, default=100)
@click.option("--seed", type=int, default=0)
@click.option("--device", default="cpu")
def train(checkpoint, data, store, out, latent, k, z_dim, prior, cond, slots, weighting, lam, policy,
          baseline_checkpoint, beta, beta_schedule, warmup_steps, cycles, ramp_ratio, free_bits, anchor_weight,
          anchor_margin, anchor_start_step, recipe, estep, estep_temperature, estep_prior, estep_balance_iters, estep_until,
          latent_embedding_norm, latent_embedding_center, aggressive_steps, aggressive_until, posterior_encoder,
          posterior_pool, steps, batch_size, lr,
          num_workers, lanes, on_bad_sample, log_every, grad_diag_every, ckpt_every, seed, device):
    """Train a CVAE from the entangled checkpoint with a weighted reconstruction (torchrun-ready)."""
    import torch

    from dataclasses import replace

    from tokweight.training.cvae import CVAEConfig
    from tokweight.training.recipes import with_recipe
    from tokweight.training.schedules import BetaSchedule
    from tokweight.training.train import run
    from tokweight.training.train_config import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

    torch.set_num_threads(1)
    given = lambda **kw: {k: v for k, v in kw.items() if v is not None}
    try:
        cfg = with_recipe(TrainConfig(
            io=IOConfig(checkpoint=checkpoint, data=data, out=out, store=store, baseline_checkpoint=baseline_checkpoint,
                        lanes=lanes, num_workers=num_workers, device=device, on_bad_sample=on_bad_sample),
            cvae=CVAEConfig(latent=latent, k=k, z_dim=z_dim, prior=prior, cond=cond, slots=slots),
            loss=LossConfig(weighting=weighting, token_weighted_reconstruction_weight=lam, policy=policy,
                            beta=BetaSchedule(beta, beta_schedule, warmup_steps, cycles, ramp_ratio),
                            free_bits=free_bits, anchor_weight=anchor_weight, anchor_margin=anchor_margin,
                            anchor_start_step=anchor_start_step),
            optim=OptimConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed),
            log=LogConfig(log_every=log_every, grad_diag_every=grad_diag_every, ckpt_every=ckpt_every)), recipe)
        remedies = cfg.remedies  # the recipe's, then the remedy flags given over it
        estep_flags = given(mode=estep, temperature=estep_temperature, prior=estep_prior,
                            balance_iters=estep_balance_iters, until_step=estep_until)
        cfg = replace(cfg, remedies=replace(remedies, estep=replace(remedies.estep, **estep_flags),
                                            **given(latent_embedding_norm=latent_embedding_norm,
                                                    latent_embedding_center=latent_embedding_center,
                                                    aggressive_steps=aggressive_steps,
                                                    aggressive_until=aggressive_until)),
                      cvae=replace(cfg.cvae, **given(posterior_encoder=posterior_encoder, posterior_pool=posterior_pool)))
        result = run(cfg)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    if int(os.environ.get("RANK", "0")) == 0:  # one report under torchrun
        echo_skips(result)
        click.echo(json.dumps(result, indent=1))


@click.command("eval")
@click.option("--run", "run_dir", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--data", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--split", default="test")
@click.option("--decode-examples", type=int, default=256)
@click.option("--device", default="cpu")
def evaluate(run_dir, data, split, decode_examples, device):
    """All metrics on a split plus decode-per-latent -> RUN/eval.json and RUN/eval.md."""
    from tokweight.training.evaluate import EvalConfig, run_eval

    try:
        result = run_eval(EvalConfig(run=run_dir, data=data, split=split, decode_examples=decode_examples,
                                     device=device))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    if "reason" in result["baseline"]:
        click.echo(f"note: {result['baseline']['reason']}", err=True)
    echo_skips(result["metrics"])
    click.echo((Path(run_dir) / "eval.md").read_text())
    click.echo(json.dumps(result["metrics"], indent=1))
