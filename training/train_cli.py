"""`tokweight train`: build the config, call run. Heavy imports stay inside. The skipped-samples line
serves `tokweight eval` (``tokweight.report.cli``) too."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import click

from tokweight.pipeline.data_option import DataSource
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.training.configs import COND_MODES, POLICIES, WEIGHTINGS, CVAEConfig, EStepConfig, LoRAConfig
from tokweight.training.convergence import StopRule
from tokweight.training.schedules import BetaSchedule
from tokweight.training.train_config import (IOConfig, LogConfig, LossConfig, OptimConfig, RemedyConfig, TrainConfig,
                                             default_remedies, default_starts)


def echo_skips(result: dict) -> None:
    """The one stderr line saying which samples the run left out, if it left any out."""
    from tokweight.pipeline.errors import Skips

    if line := Skips(result.get("skipped_shards")).summary_line():
        click.echo(line, err=True)


def given(**options) -> dict:
    """The options the user set: a default lives in the config dataclasses, never here."""
    return {k: v for k, v in options.items() if v is not None}


def shown(text: str, default) -> str:
    """A flag's help with the config dataclass's default: the CLI shows a default, it never sets one."""
    return f"{text}  [default: {default}]".strip()


def with_labelled(latent: str | None, labelled: float | None) -> RemedyConfig | None:
    """The latent's default remedies with ``--labelled`` set in its E-step; None (the default's) without it."""
    if labelled is None:
        return None
    remedies = default_remedies(latent or CVAEConfig.latent)
    return replace(remedies, estep=replace(remedies.estep, labelled=labelled))


@click.command("train")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, resolve_path=True), required=True,
              help="Entangled checkpoint to initialise the CVAE from.")
@click.option("--data", type=DataSource(resolve=True), required=True)
@click.option("--store", type=click.Path(file_okay=False, resolve_path=True), default=None,
              help="Baseline store root (`tokweight extract` wrote it); needed by the default policy.")
@click.option("--out", type=click.Path(file_okay=False, resolve_path=True), required=True, help="Run directory (resumed if present).")
@click.option("--latent", type=click.Choice(["discrete", "continuous"]), default=None,
              help=shown("", CVAEConfig.latent))
@click.option("--k", type=int, default=None,
              help=shown("Latent values (discrete); clusters for continuous evaluation.", CVAEConfig.k))
@click.option("--z-dim", type=int, default=None, help=shown("Continuous latent dimensions.", CVAEConfig.z_dim))
@click.option("--samples", type=int, default=None,
              help=shown("Draws of a continuous latent per example, each a decoder pass, among which its E-step "
                         "chooses.", CVAEConfig(latent="continuous").samples))
@click.option("--cond", type=click.Choice(COND_MODES), default=None, help=shown("z pathway.", CVAEConfig.cond))
@click.option("--slots", type=int, default=None,
              help=shown("Latent slots of the prefix pathway.", CVAEConfig(cond="prefix").slots))
@click.option("--weighting", type=click.Choice(WEIGHTINGS), default=None,
              help=shown("Reconstruction weighting.", LossConfig.weighting))
@click.option("--token-weighted-reconstruction-weight", "lam", type=float, default=None,
              help=shown("lambda in (1 - lambda) * uniform + lambda * weighting.",
                         LossConfig.token_weighted_reconstruction_weight))
@click.option("--policy", type=click.Choice(POLICIES), default=None,
              help=shown("Where b comes from: the store, an extra frozen pass, or the current backbone.",
                         LossConfig.policy))
@click.option("--baseline-checkpoint", type=click.Path(exists=True, file_okay=False, resolve_path=True), default=None,
              help="Checkpoint b came from (default: --checkpoint).")
@click.option("--beta", type=float, default=None, help=shown("KL weight after the warm-up.", BetaSchedule.beta))
@click.option("--warmup-steps", type=int, default=None,
              help=shown("Steps of beta's linear warm-up from 0.", BetaSchedule.warmup_steps))
@click.option("--labelled", type=float, default=None,
              help=shown("Share of the examples with a strategy label (the strategies listed in the data's dataset.json) "
                         "whose latent value the E-step fixes to their label's: value k then means strategies[k] "
                         "(discrete latent; about a fifth is needed, 0: none).", EStepConfig.labelled))
@click.option("--anchor-weight", type=float, default=None,
              help=shown(f"Weight of the anchor term that keeps every token within {LossConfig.anchor_margin} nats of "
                         "the base model, from the end of the warm-up (0: off).", LossConfig.anchor_weight))
@click.option("--steps", type=int, default=None,
              help=shown("Cap on optimizer steps; the run stops earlier once validation says it converged.",
                         OptimConfig.steps))
@click.option("--starts", type=int, default=None,
              help=shown("Initialisations trained --start-steps each; the one whose validation NLL is least goes on "
                         "(RUN/starts/, RUN/starts.json).", f"{default_starts('discrete')} for a discrete latent, "
                         f"{default_starts('continuous')} for a continuous one"))
@click.option("--start-steps", type=int, default=None,
              help=shown("Steps each start trains before they are compared.", OptimConfig.start_steps))
@click.option("--batch-size", type=int, default=None, help=shown("Per rank.", OptimConfig.batch_size))
@click.option("--lr", type=float, default=None, help=shown("AdamW learning rate.", OptimConfig.lr))
@click.option("--lr-decay", type=float, default=None,
              help=shown("Fraction of the run over which the learning rate falls linearly to 0 at its end: the last "
                         "steps before --steps, or as many more once the run converged (0: constant).",
                         OptimConfig.lr_decay))
@click.option("--num-workers", type=int, default=None, help=shown("Loader worker processes.", IOConfig.num_workers))
@click.option("--lanes", type=int, default=None,
              help="Sample streams of the global batch (default: one per rank); the data order depends on it.")
@click.option("--on-bad-sample", type=click.Choice(["error", "skip"]), default=None,
              help=shown("A bad sample the store does not record as skipped: stop naming it, or skip and count it.",
                         IOConfig.on_bad_sample))
@click.option("--eval-every", type=int, default=None,
              help=shown(f"Steps between validations on {LogConfig.eval_examples} val examples, which the stop rule "
                         "reads (0: none, the run trains to --steps).", LogConfig.eval_every))
@click.option("--patience", type=int, default=None,
              help=shown("Validations without an improvement of the val objective or the MI before the run counts as "
                         "converged and its lr falls (0: never, the run trains to --steps).", StopRule.patience))
@click.option("--log-every", type=int, default=None, help=shown("Steps between metrics lines.", LogConfig.log_every))
@click.option("--ckpt-every", type=int, default=None, help=shown("Steps between checkpoints.", LogConfig.ckpt_every))
@click.option("--seed", type=int, default=None, help=shown("", OptimConfig.seed))
@click.option("--device", default=None, help=shown("auto (CUDA when present), cpu, cuda or cuda:N.", IOConfig.device))
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
              help=shown("The training forward's precision (bfloat16: autocast, for large models on a GPU).",
                         IOConfig.dtype))
@click.option("--grad-checkpointing", is_flag=True, default=None,
              help="Recompute activations in the backward instead of keeping them: less memory, more time.")
@click.option("--lora-rank", type=int, default=None,
              help=shown("Train LoRA adapters of this rank on every linear layer of a frozen backbone (alpha = rank), "
                         "with the latent token rows and the CVAE's heads; needs pip install 'tokweight[lora]' "
                         "(0: train every parameter).", LoRAConfig.rank))
@threads_option
def train(checkpoint, data, store, out, latent, k, z_dim, samples, cond, slots, weighting, lam, policy,
          baseline_checkpoint, beta, warmup_steps, labelled, anchor_weight, steps, starts, start_steps, batch_size,
          lr, lr_decay, num_workers, lanes, on_bad_sample, eval_every, patience, log_every, ckpt_every, seed, device,
          dtype, grad_checkpointing, lora_rank, threads):
    """Train a CVAE from the entangled checkpoint with a weighted reconstruction (torchrun-ready).

    The defaults are the recipe that keeps z from scratch with the decoder whole: a 4-slot prefix,
    surprisal-share, beta 0.3 warmed up over 100 steps, the anchor term after the warm-up, the exact
    E-step with centred latent rows (discrete; a continuous latent: the hard E-step over 4 draws of a 2-dimensional
    z), lr 3e-4 falling linearly to 0 over the run's last fifth, three starts of 400 steps of which the one that
    reconstructs validation best goes on (a continuous latent: one). Once its periodic validations stop
    improving the run ends after that fall, else at --steps, and says which."""
    from tokweight.training.run_dir import CheckpointWriteError
    from tokweight.training.train import run

    set_threads(threads)
    try:
        cfg = TrainConfig(
            io=IOConfig(checkpoint=checkpoint, data=data, out=out, store=store, baseline_checkpoint=baseline_checkpoint,
                        lanes=lanes, **given(num_workers=num_workers, device=device, dtype=dtype,
                                               grad_checkpointing=grad_checkpointing, on_bad_sample=on_bad_sample)),
            cvae=CVAEConfig(**given(latent=latent, k=k, z_dim=z_dim, samples=samples, cond=cond, slots=slots)),
            loss=LossConfig(beta=BetaSchedule(**given(beta=beta, warmup_steps=warmup_steps)),
                            **given(weighting=weighting, token_weighted_reconstruction_weight=lam, policy=policy,
                                    anchor_weight=anchor_weight)),
            optim=OptimConfig(stop=StopRule(**given(patience=patience)),
                              **given(steps=steps, starts=starts, start_steps=start_steps, batch_size=batch_size,
                                      lr=lr, lr_decay=lr_decay, seed=seed)),
            log=LogConfig(**given(eval_every=eval_every, log_every=log_every, ckpt_every=ckpt_every)),
            lora=LoRAConfig(**given(rank=lora_rank)), remedies=with_labelled(latent, labelled))
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
    start, end = stop["lr_decay"]
    fall = f"lr fell to 0 over steps {start}-{end}" if end > start else "constant lr"
    return f"stopped at step {stop['step']}: {stop['reason']} ({best}; {fall}); rule: {stop['rule']}"
