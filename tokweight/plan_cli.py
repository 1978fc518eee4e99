"""`tokweight plan`: a configuration's peak memory per rank by kind, its FLOPs, and the largest batch that fits,
from a model config alone (``training.plan``). torch stays unimported until the command runs."""

from __future__ import annotations

import json

import click

from tokweight.pipeline.threads import set_threads, threads_option

KIND_ORDER = ("parameters", "gradients", "optimizer", "activations", "temporaries")


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f}"


def table(plan) -> str:
    """The plan as text: one row per phase, its peak's bytes by kind (GiB) and its FLOPs."""
    cfg = plan.config
    head = (f"{cfg.model}: {plan.parameters / 1e9:.3f}B parameters, {plan.trainable / 1e9:.3f}B trained; K={cfg.k}, "
            f"batch {cfg.batch_size} per rank, {cfg.seq_len} tokens, {cfg.dtype}, lora rank {cfg.lora_rank}, "
            f"grad checkpointing {'on' if cfg.grad_checkpointing else 'off'}, {cfg.ranks} rank(s) ({cfg.shard})")
    from tokweight.training.train_config import LogConfig

    evals = cfg.eval_batch_size or LogConfig().eval_batch_size
    rows = [f"{'phase':<11}" + "".join(f"{k:>13}" for k in (*KIND_ORDER, "peak GiB")) + f"{'TFLOP':>10}"]
    for name, label in (("train", "train"), ("validation", f"val ({evals})"), ("decode", "decode")):
        phase = getattr(plan, name)
        rows.append(f"{label:<11}" + "".join(f"{gib(phase.kinds[k]):>13}" for k in KIND_ORDER)
                    + f"{gib(phase.peak):>13}{phase.flops / 1e12:>10.2f}")
    from tokweight.training.plan import fits_line

    verdict = "fits" if plan.fits else "does not fit"
    lines = [head, *rows, f"training {verdict} {cfg.memory_gib:g} GiB per rank (less {cfg.headroom:.0%} headroom)"]
    if line := fits_line(plan):
        lines.append(line)
    lines.append(f"planned in {plan.wall_s:.1f} s (fake tensors: nothing allocated)")
    return "\n".join(lines)


@click.command("plan")
@click.option("--model", required=True,
              help="A model config: a built-in name (training/plan_models.py: qwen2.5-0.5b, qwen2.5-1.5b, "
                   "llama-3.1-8b, gpt-tiny), a Hugging Face config.json, or a checkpoint directory holding one.")
@click.option("--k", type=int, default=4, help="Latent values: the decoder runs K copies of every example.")
@click.option("--batch-size", type=int, default=8, help="Examples per rank.")
@click.option("--seq-len", type=int, default=512, help="Tokens of an example's z-free sequence (half of them y).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32"]), default="bfloat16",
              help="The forward's dtype, as train's --dtype: bfloat16 is what its auto gives on a GPU.")
@click.option("--lora-rank", type=int, default=0, help="As train's --lora-rank (0: every parameter trains).")
@click.option("--grad-checkpointing", is_flag=True, help="As train's --grad-checkpointing.")
@click.option("--shard", type=click.Choice(["ddp", "fsdp"]), default="ddp", help="As train's --shard.")
@click.option("--ranks", type=int, default=1, help="Ranks of the job (torchrun's processes); the plan is one rank's.")
@click.option("--eval-batch-size", type=int, default=None,
              help="Examples per rank of a validation forward (default: train's log.eval_batch_size).")
@click.option("--memory", type=float, default=80.0, help="Device memory per rank, GiB: what the largest batch must fit.")
@click.option("--search/--no-search", default=True, help="Search the largest batch that fits --memory.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (bytes and FLOPs) instead of a table.")
@threads_option
def plan(model, k, batch_size, seq_len, dtype, lora_rank, grad_checkpointing, shard, ranks, eval_batch_size, memory,
         search, as_json, threads):
    """Peak memory per rank by kind (parameters, gradients, optimizer state, activations, temporaries) of one
    training step, one validation forward and one decode step, their FLOPs, and the largest batch per rank that fits
    --memory: the configuration run on fake tensors, nothing downloaded or allocated, no GPU needed."""
    from tokweight.training.plan_config import PlanConfig
    from tokweight.training.plan import plan as make_plan

    set_threads(threads)
    result = make_plan(PlanConfig(model=model, k=k, batch_size=batch_size, seq_len=seq_len, dtype=dtype,
                                  lora_rank=lora_rank, grad_checkpointing=grad_checkpointing, shard=shard, ranks=ranks,
                                  eval_batch_size=eval_batch_size, memory_gib=memory), search=search)
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else table(result))
