"""`tokweight train`: a TrainConfig from the defaults, a configuration file, the flags and ``--set``, in that
order; then ``training.loop.train.run``. Heavy imports stay inside. The skipped-samples line serves `tokweight eval`
and `encode` too."""

from __future__ import annotations

import json
import os

import click

from tokweight.commands.flags import Flag, fields_set, options
from tokweight.pipeline.data.data_option import DataSource
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.pipeline.models.dtypes import TRAIN_DTYPES
from tokweight.training.config.migrations import train_config_from
from tokweight.training.config.components import COND_MODES, LATENTS, POLICIES, WEIGHTINGS
from tokweight.training.config.train import SHARDS, TrainConfig, with_resolved_anew

FLAGS = (
    Flag("--checkpoint", "io.checkpoint", "Entangled checkpoint to initialise the CVAE from.",
         type=click.Path(exists=True, file_okay=False, resolve_path=True)),
    Flag("--data", "io.data", "The dataset: a directory with train/ and val/ shards, or their URLs "
         "(http(s):// or pipe: patterns, or a file of URLs).", type=DataSource(resolve=True)),
    Flag("--store", "io.store", "Baseline store root (`tokweight extract` wrote it); the default policy reads it."),
    Flag("--out", "io.out", "Run directory, resumed if it holds this run."),
    Flag("--latent", "cvae.latent", choices=LATENTS),
    Flag("--k", "cvae.k", "Latent values (discrete); clusters for a continuous latent's evaluation."),
    Flag("--z-dim", "cvae.z_dim", "Continuous latent dimensions."),
    Flag("--samples", "cvae.samples", "Draws of a continuous latent per example, among which its E-step chooses.",
         default="4 for a continuous latent, 1 for a discrete one"),
    Flag("--cond", "cvae.cond", "z pathway.", choices=COND_MODES,
         default="query for a discrete latent, prefix for a continuous one"),
    Flag("--slots", "cvae.slots", "Latent slots of the prefix pathway.", default="4 for the prefix, else 1"),
    Flag("--weighting", "loss.weighting", "Reconstruction weighting.", choices=tuple(WEIGHTINGS)),
    Flag("--token-weighted-reconstruction-weight", "loss.token_weighted_reconstruction_weight",
         "lambda in (1 - lambda) * uniform + lambda * weighting."),
    Flag("--policy", "loss.policy", "Where b comes from: the store, an extra frozen pass, or the current backbone.",
         choices=tuple(POLICIES)),
    Flag("--baseline-checkpoint", "io.baseline_checkpoint", "Checkpoint b came from (default: --checkpoint).",
         type=click.Path(exists=True, file_okay=False, resolve_path=True)),
    Flag("--beta", "loss.beta", "KL weight after the warm-up."),
    Flag("--warmup-steps", "loss.beta_warmup_steps", "Steps of beta's linear warm-up from 0."),
    Flag("--labelled", "estep.labelled",
         "Share of the examples with a strategy label (the strategies listed in the data's dataset.json) whose "
         "latent value the E-step fixes: every line of a label to one value, the one the decoders already give "
         "that label's lines (estep.label_map); eval's table says which (discrete latent)."),
    Flag("--anchor-weight", "loss.anchor_weight",
         "Weight of the anchor term that keeps every token within loss.anchor_margin nats of the base model, from "
         "the end of the warm-up (0: off)."),
    Flag("--steps", "optim.steps", "Cap on optimizer steps; the run stops earlier once validation says it converged."),
    Flag("--starts", "optim.starts", "Initialisations trained --start-steps each; the one whose validation "
         "objective (the weighting's reconstruction under q plus beta KL) is least goes on (RUN/starts/, "
         "RUN/starts.json).",
         default="3 for a discrete latent, 1 for a continuous one"),
    Flag("--start-steps", "optim.start_steps", "Steps each start trains before they are compared; again while no "
         "start's code has formed, up to optim.start_steps_max."),
    Flag("--batch-size", "optim.batch_size", "Per rank."),
    Flag("--lr", "optim.lr", "AdamW learning rate."),
    Flag("--lr-decay", "optim.lr_decay",
         "Fraction of the run over which the learning rate falls linearly to 0 at its end: the last steps before "
         "--steps, or as many more once the run converged (0: constant)."),
    Flag("--seed", "optim.seed"),
    Flag("--num-workers", "io.num_workers", "Loader worker processes."),
    Flag("--lanes", "io.lanes", "Sample streams of the global batch; the data order depends on it.",
         default="one per rank"),
    Flag("--on-bad-sample", "io.on_bad_sample",
         "A bad sample the store does not record as skipped: stop naming it, or skip and count it.",
         choices=("error", "skip")),
    Flag("--eval-every", "log.eval_every",
         "Steps between validations, which the stop rule reads (0: none, the run trains to --steps)."),
    Flag("--patience", "optim.stop.patience",
         "Validations without an improvement of the val objective or the MI before the run counts as converged and "
         "its lr falls (0: never, the run trains to --steps)."),
    Flag("--log-every", "log.log_every", "Steps between metrics lines."),
    Flag("--ckpt-every", "log.ckpt_every", "Steps between checkpoints."),
    Flag("--report-to", "log.report_to",
         "Trackers that get the run's metrics, configuration and figures, comma-separated: tensorboard, mlflow, wandb "
         "(offline, in the run directory; each needs pip install 'tokweight[NAME]').", default="none"),
    Flag("--device", "io.device", "auto (CUDA when present), cpu, cuda or cuda:N."),
    Flag("--dtype", "io.dtype", "The forward's precision: auto (bfloat16 on CUDA, float32 elsewhere), float32 or "
         "bfloat16 (autocast; trained parameters float32, frozen weights held in bfloat16).", choices=TRAIN_DTYPES),
    Flag("--grad-checkpointing", "io.grad_checkpointing",
         "Recompute activations in the backward instead of keeping them: less memory, more time."),
    Flag("--shard", "io.shard",
         "Under torchrun: ddp (every rank holds the whole model) or fsdp (parameters, gradients and optimizer state "
         "sharded over the ranks per transformer block, for a model whose full fine-tune does not fit one GPU).",
         choices=SHARDS),
    Flag("--lora-rank", "lora.rank",
         "Train LoRA adapters of this rank on every linear layer of a frozen backbone (alpha = rank), with the latent "
         "token rows and the CVAE's heads; needs pip install 'tokweight[lora]' (0: train every parameter)."),
)
"""The flags of `tokweight train`: the fields a user has a reason to set on the command line. Every other field
is reached with --set, and all of them with --config."""
REQUIRED = ("io.checkpoint", "io.data", "io.out")
LOCAL_PATHS = ("io.checkpoint", "io.store", "io.out", "io.baseline_checkpoint")


def echo_skips(result: dict) -> None:
    """The one stderr line saying which samples the run left out, if it left any out."""
    from tokweight.pipeline.data.errors import Skips

    if line := Skips(result.get("skipped_shards")).summary_line():
        click.echo(line, err=True)


def absolute(values: dict) -> dict:
    """Local paths made absolute, so that a run's config.json works from any directory (a URL stays as it is)."""
    from tokweight.store.manifest import is_url

    out = {k: (os.path.abspath(v) if k in LOCAL_PATHS and v else v) for k, v in values.items()}
    if out.get("io.data") and not is_url(out["io.data"]):
        out["io.data"] = os.path.abspath(out["io.data"])
    return out


def train_config(config: str | None, flags: dict, sets: tuple[str, ...]) -> TrainConfig:
    """The dataclass defaults, then ``config`` (TOML or a run's config.json), then the flags, then ``--set``."""
    from tokweight.config_files import assignment, read, with_values

    start = read(config) if config else {}
    values = with_resolved_anew(absolute(flags) | absolute(dict(assignment(item) for item in sets)), start)
    obj = with_values(start, values)
    missing = [field for field in REQUIRED if not (obj.get("io") or {}).get(field.split(".")[1])]
    if missing:
        names = [next(f.name for f in FLAGS if f.field == field) for field in missing]
        raise ValueError(f"missing {', '.join(names)}: give {'them' if len(names) > 1 else 'it'} on the command line "
                         "or in --config")
    return train_config_from(obj)


@click.command("train")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A configuration file (TOML, or a run's own config.json): the defaults it changes. Flags "
                   "and --set override it.")
@click.option("--set", "sets", multiple=True, metavar="GROUP.FIELD=VALUE",
              help="Set any field of the configuration, e.g. --set loss.beta=0.5 --set estep.balance_iters=3 "
                   "(repeatable; docs/reference.md lists every field).")
@options(TrainConfig, FLAGS)
@threads_option
def train(config, sets, threads, **flags):
    """Train a CVAE from the entangled checkpoint with a weighted reconstruction (torchrun-ready).

    The defaults are the method as docs/results.md measures it: z offsets the decoder's queries (a continuous
    latent: a 4-slot prefix), surprisal-share, beta 0.3 warmed up over 100 steps, the exact E-step over the K
    decoder passes with centred latent rows, the anchor term after the warm-up, lr 3e-4 falling to 0 over the
    run's last fifth, and three starts of which the one of least validation objective goes on (a continuous
    latent: one). Once its periodic validations stop improving the run ends after that fall, else at --steps,
    and says which."""
    from tokweight.commands.tracking import train_reported
    from tokweight.training.loop.run_dir import CheckpointWriteError

    set_threads(threads)
    try:
        cfg = train_config(config, fields_set(FLAGS, flags), sets)
        result = train_reported(cfg)
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

