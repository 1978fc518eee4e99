"""`tokweight plan`: a configuration's peak memory per rank by kind, its FLOPs, and the largest batch that fits,
from a model config alone (``training.plan.estimate``). torch stays unimported until the command runs."""

from __future__ import annotations

import json

import click

from tokweight.commands.flags import Flag, config_options, configured, options
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.training.config.plan import PLAN_DTYPES, PlanConfig
from tokweight.training.config.train import SHARDS

KIND_ORDER = ("parameters", "gradients", "optimizer", "activations", "temporaries")


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f}"


def table(plan) -> str:
    """The plan as text: one row per phase, its peak's bytes by kind (GiB) and its FLOPs."""
    cfg = plan.config
    head = (f"{cfg.model}: {plan.parameters / 1e9:.3f}B parameters, {plan.trainable / 1e9:.3f}B trained; K={cfg.k}, "
            f"batch {cfg.batch_size} per rank, {cfg.seq_len} tokens, {cfg.dtype}, lora rank {cfg.lora_rank}, "
            f"grad checkpointing {'on' if cfg.grad_checkpointing else 'off'}, z-free pass and copies in "
            f"{'one forward' if cfg.train_config().io.merges_on('cuda') else 'two'}, {cfg.ranks} rank(s) ({cfg.shard})")
    from tokweight.training.config.train import LogConfig

    evals = cfg.eval_batch_size or LogConfig().eval_batch_size
    rows = [f"{'phase':<11}" + "".join(f"{k:>13}" for k in (*KIND_ORDER, "peak GiB")) + f"{'TFLOP':>10}"]
    for name, label in (("train", "train"), ("validation", f"val ({evals})"), ("decode", "decode")):
        phase = getattr(plan, name)
        rows.append(f"{label:<11}" + "".join(f"{gib(phase.kinds[k]):>13}" for k in KIND_ORDER)
                    + f"{gib(phase.peak):>13}{phase.flops / 1e12:>10.2f}")
    from tokweight.training.plan.estimate import fits_line

    memory = f"{cfg.memory_gib:g} GiB per rank (less {cfg.headroom:.0%} headroom)"
    trains = plan.train.peak <= cfg.budget
    verdict = (f"training and its validation fit {memory}" if plan.fits else
               f"training fits {memory}; its validation does not" if trains else f"training does not fit {memory}")
    lines = [head, *rows, verdict]
    if line := fits_line(plan):
        lines.append(line)
    lines.append(f"planned in {plan.wall_s:.1f} s (fake tensors: nothing allocated)")
    return "\n".join(lines)


FLAGS = (
    Flag("--model", "model", "A model config: a built-in name (training/plan/models.py: qwen2.5-0.5b, qwen2.5-1.5b, "
         "llama-3.1-8b, gpt-tiny), a Hugging Face config.json, or a checkpoint directory holding one."),
    Flag("--k", "k"),
    Flag("--batch-size", "batch_size"),
    Flag("--seq-len", "seq_len"),
    Flag("--dtype", "dtype", choices=PLAN_DTYPES),
    Flag("--lora-rank", "lora_rank"),
    Flag("--grad-checkpointing", "grad_checkpointing"),
    Flag("--shard", "shard", choices=SHARDS),
    Flag("--ranks", "ranks"),
    Flag("--eval-batch-size", "eval_batch_size"),
    Flag("--memory", "memory_gib"),
)


@click.command("plan")
@config_options(PlanConfig, "headroom=0.2")
@options(PlanConfig, FLAGS)
@click.option("--search/--no-search", default=True, help="Search the largest batch that fits --memory.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (bytes and FLOPs) instead of a table.")
@threads_option
def plan(config, sets, search, as_json, threads, **flags):
    """Peak memory per rank by kind (parameters, gradients, optimizer state, activations, temporaries) of one
    training step, one validation forward and one decode step, their FLOPs, and the largest batch per rank that fits
    --memory: the configuration run on fake tensors, nothing downloaded or allocated, no GPU needed."""
    from tokweight.training.plan.estimate import plan as make_plan

    set_threads(threads)
    result = make_plan(configured(PlanConfig, FLAGS, flags, config, sets), search=search)
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else table(result))
