"""`tokweight extract`: build an ExtractConfig from the options and call pipeline.extract.run.

Also runs under a launcher: `torchrun --nproc-per-node N -m tokweight.cli extract ...`.
"""

from __future__ import annotations

import json

import click

from tokweight.pipeline.dtypes import DTYPE_CHOICES
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.store.formats import PARQUET, PART_FORMATS


@click.command("extract")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), required=True,
              help="Checkpoint directory of the frozen z-free base model.")
@click.option("--data", required=True,
              help="Dataset directory (every *.tar below it), a glob of shards, or URLs: a brace pattern of http(s):// "
                   "or pipe: URLs (https://host/d/train/shard-{000000..000099}.tar), or a file listing one per line.")
@click.option("--store", type=click.Path(file_okay=False), required=True, help="Store root directory.")
@click.option("--format", "fmt", type=click.Choice(PART_FORMATS), default=PARQUET)
@click.option("--batch-tokens", type=int, default=16384, help="Computed tokens per forward batch.")
@click.option("--device", default="auto", show_default=True,
              help="torch device: auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto",
              help="Dtype of the forward (auto: bfloat16 on CUDA, float32 elsewhere); the log-softmax is float32 "
                   "whatever it is.")
@click.option("--template", default="tokweight", show_default=True,
              help="The checkpoint's format: tokweight (the built-in template), chat (the tokenizer's own chat "
                   "template: x the user turn, y the assistant turn) or FILE, a JSON string template "
                   '{"text": "Question: {x}\\nAnswer: {y}", "end": "<|endoftext|>"}. Recorded in the store: '
                   "train, eval and experiment read it there.")
@click.option("--on-bad-sample", type=click.Choice(["error", "skip"]), default="error",
              help="Stop at a bad sample or truncated shard, or skip it and count it in the manifest.")
@click.option("--wait-lock", type=float, default=0.0, help="Seconds to wait for another extract on this store.")
@click.option("--progress/--no-progress", default=True)
@click.option("--reader-process/--no-reader-process", default=None,
              help="Read and batch shards in a separate process ahead of the model, or in this one. Default: a "
                   "reader process where half a CPU or more is idle beside the forward (on CPU: CPUs less torch "
                   "threads less the load average of other work; on CUDA: beside the main thread), and 2+ shards; "
                   "the summary's reader_process says which ran. Same parts either way.")
@threads_option
def extract(checkpoint, data, store, fmt, batch_tokens, device, dtype, template, on_bad_sample, wait_lock, progress,
            reader_process, threads):
    """Compute per-token baselines b_t of CHECKPOINT once and store them under STORE/fingerprint=<fp>/."""
    from tokweight.pipeline.errors import SampleError, Skips
    from tokweight.pipeline.extract_config import ExtractConfig
    from tokweight.pipeline.extract import run
    from tokweight.pipeline.ranks import RankFailed
    from tokweight.store.lock import StoreLockedError

    set_threads(threads)
    cfg = ExtractConfig(checkpoint=checkpoint, data=data, store=store, format=fmt, batch_tokens=batch_tokens,
                        device=device, dtype=dtype, template=template, on_bad_sample=on_bad_sample,
                        lock_wait_s=wait_lock, progress=progress, reader_process=reader_process)
    try:
        summary = run(cfg)
    except (SampleError, StoreLockedError, RankFailed, OSError, ValueError) as e:  # OSError: a full disk, an I/O error
        raise click.ClickException(str(e)) from e
    if summary["rank"] != 0:  # rank 0 (or a single process) reports
        return
    if summary["nothing_to_do"]:
        click.echo(f"store {summary['store']} is complete for these inputs: nothing to do", err=True)
    if line := Skips(summary.get("skipped_shards")).summary_line():
        click.echo(line, err=True)
    if changed := summary.get("changed_shards"):
        click.echo(f"extracted {len(changed)} shard(s) again, changed since their parts were written: "
                   f"{', '.join(changed)}", err=True)
    click.echo(json.dumps(summary, indent=1))
