"""`tokweight train`: build the config, call run. Heavy imports stay inside. The threads option and
the skipped-samples line serve `tokweight eval` (``tokweight.report.cli``) too."""

from __future__ import annotations

import json
import os

import click


def echo_skips(result: dict) -> None:
    """The one stderr line saying which samples the run left out, if it left any out."""
    from tokweight.pipeline.errors import Skips

    if line := Skips(result.get("skipped_shards")).summary_line():
        click.echo(line, err=True)


def given(**options) -> dict:
    """The options the user set: a default lives in the config dataclasses, never here."""
    return {k: v for k, v in options.items() if v is not None}


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads: its own choice unless --threads is given (1 is fastest for tiny models on a
    shared 2-core machine; a larger model or machine wants more)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


threads_option = click.option("--threads", type=int, default=None,
                              help="torch threads (default: torch's own choice for this machine).")


@click.command("train")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), required=True,
              help="Entangled checkpoint to initialise the CVAE from.")
@click.option("--data", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Baseline store root (`tokweight extract` wrote it); needed by the default policy.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Run directory (resumed if present).")
@click.option("--latent", type=click.Choice(["discrete", "continuous"]), default=None, help="[default: discrete]")
@click.option("--k", type=int, default=None, help="Latent values (discrete); clusters for continuous evaluation.  "
                                                  "[default: 4]")
@click.option("--z-dim", type=int, default=None, help="Continuous latent dimensions.  [default: 8]")
@click.option("--cond", type=click.Choice(["token", "prefix", "layernorm"]), default=None,
              help="z pathway.  [default: prefix]")
@click.option("--slots", type=int, default=None, help="Latent slots of the prefix pathway.  [default: 4]")
@click.option("--weighting", type=click.Choice(["uniform", "sum", "surprisal-share", "inverse-surprisal",
                                                "example-inverse", "distribution-rescale"]), default=None,
              help="Reconstruction weighting.  [default: surprisal-share]")
@click.option("--token-weighted-reconstruction-weight", "lam", type=float, default=None,
              help="lambda in (1 - lambda) * uniform + lambda * weighting.  [default: 1]")
@click.option("--policy", type=click.Choice(["precomputed", "frozen", "dynamic"]), default=None,
              help="Where b comes from: the store, an extra frozen pass, or the current backbone.  "
                   "[default: precomputed]")
@click.option("--baseline-checkpoint", type=click.Path(exists=True, file_okay=False), default=None,
              help="Checkpoint b came from (default: --checkpoint).")
@click.option("--beta", type=float, default=None, help="KL weight after the warm-up.  [default: 0.3]")
@click.option("--warmup-steps", type=int, default=None, help="Steps of beta's linear warm-up from 0.  [default: 100]")
@click.option("--anchor-weight", type=float, default=None,
              help="Weight of the anchor term that keeps every token within 0.05 nats of the base model, from the "
                   "end of the warm-up (0: off).  [default: 1]")
@click.option("--steps", type=int, default=None,
              help="Cap on optimizer steps; the run stops earlier once validation says it converged.  "
                   "[default: 6000]")
@click.option("--batch-size", type=int, default=None, help="Per rank.  [default: 32]")
@click.option("--lr", type=float, default=None, help="AdamW learning rate.  [default: 3e-4]")
@click.option("--num-workers", type=int, default=None, help="Loader worker processes.  [default: 1]")
@click.option("--lanes", type=int, default=None,
              help="Sample streams of the global batch (default: one per rank); the data order depends on it.")
@click.option("--on-bad-sample", type=click.Choice(["error", "skip"]), default=None,
              help="A bad sample the store does not record as skipped: stop naming it, or skip and count it.  "
                   "[default: error]")
@click.option("--eval-every", type=int, default=None,
              help="Steps between validations on 256 val examples, which the stop rule reads (0: none, the run "
                   "trains to --steps).  [default: 50]")
@click.option("--patience", type=int, default=None,
              help="Validations without an improvement of the val objective or the MI before the run stops as "
                   "converged (0: never, the run trains to --steps).  [default: 10]")
@click.option("--log-every", type=int, default=None, help="Steps between metrics lines.  [default: 10]")
@click.option("--ckpt-every", type=int, default=None, help="Steps between checkpoints.  [default: 100]")
@click.option("--seed", type=int, default=None, help="[default: 0]")
@click.option("--device", default=None, help="auto (CUDA when present), cpu, cuda or cuda:N.  [default: auto]")
@threads_option
def train(checkpoint, data, store, out, latent, k, z_dim, cond, slots, weighting, lam, policy, baseline_checkpoint,
          beta, warmup_steps, anchor_weight, steps, batch_size, lr, num_workers, lanes, on_bad_sample, eval_every,
          patience, log_every, ckpt_every, seed, device, threads):
    """Train a CVAE from the entangled checkpoint with a weighted reconstruction (torchrun-ready).

    The defaults are the recipe that keeps z from scratch with the decoder whole: a 4-slot prefix,
    surprisal-share, beta 0.3 warmed up over 100 steps, the anchor term after the warm-up, the exact
    E-step with centred latent rows (discrete), lr 3e-4. The run stops once its periodic validations stop
    improving, or at --steps, and says which."""
    from tokweight.training.configs import CVAEConfig
    from tokweight.training.convergence import StopRule
    from tokweight.training.schedules import BetaSchedule
    from tokweight.training.run_dir import CheckpointWriteError
    from tokweight.training.train import run
    from tokweight.training.train_config import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

    set_threads(threads)
    try:
        cfg = TrainConfig(
            io=IOConfig(checkpoint=checkpoint, data=data, out=out, store=store, baseline_checkpoint=baseline_checkpoint,
                        lanes=lanes, **given(num_workers=num_workers, device=device, on_bad_sample=on_bad_sample)),
            cvae=CVAEConfig(**given(latent=latent, k=k, z_dim=z_dim, cond=cond, slots=slots)),
            loss=LossConfig(beta=BetaSchedule(**given(beta=beta, warmup_steps=warmup_steps)),
                            **given(weighting=weighting, token_weighted_reconstruction_weight=lam, policy=policy,
                                    anchor_weight=anchor_weight)),
            optim=OptimConfig(stop=StopRule(**given(patience=patience)),
                              **given(steps=steps, batch_size=batch_size, lr=lr, seed=seed)),
            log=LogConfig(**given(eval_every=eval_every, log_every=log_every, ckpt_every=ckpt_every)))
        result = run(cfg)
    except (ValueError, CheckpointWriteError) as e:
        raise click.ClickException(str(e)) from e
    if int(os.environ.get("RANK", "0")) == 0:  # one report under torchrun
        echo_skips(result)
        click.echo(json.dumps(result, indent=1))
        click.echo(stop_line(result["stop"]), err=True)


def stop_line(stop: dict) -> str:
    """The one line saying why the run stopped."""
    best = f"best validation at step {stop['best_step']}" if stop["best_step"] is not None else "no counted validation"
    return f"stopped at step {stop['step']}: {stop['reason']} ({best}); rule: {stop['rule']}"
