"""`tokweight extract`: an ExtractConfig from its defaults, a configuration file, the flags and ``--set``, in that
order; then pipeline.extract.extract.run.

Also runs under a launcher: `torchrun --nproc-per-node N -m tokweight.cli extract ...`.
"""

from __future__ import annotations

import json

import click

from tokweight.commands.flags import Flag, config_options, configured_run, options
from tokweight.pipeline.models.dtypes import DTYPE_CHOICES
from tokweight.pipeline.extract.config import ON_BAD_SAMPLE, ExtractConfig
from tokweight.pipeline.threads import threads_option
from tokweight.store.formats import PART_FORMATS

FLAGS = (
    Flag("--checkpoint", "checkpoint", type=click.Path(exists=True, file_okay=False)),
    Flag("--data", "data"),
    Flag("--store", "store", type=click.Path(file_okay=False)),
    Flag("--format", "format", choices=PART_FORMATS),
    Flag("--batch-tokens", "batch_tokens"),
    Flag("--device", "device"),
    Flag("--dtype", "dtype", choices=DTYPE_CHOICES),
    Flag("--template", "template"),
    Flag("--on-bad-sample", "on_bad_sample", choices=ON_BAD_SAMPLE),
    Flag("--wait-lock", "lock_wait_s"),
    Flag("--progress/--no-progress", "progress"),
    Flag("--reader-process/--no-reader-process", "reader_process"),
)
"""The flags of `tokweight extract`; every field, retry's included, is reached with --set and --config."""


@click.command("extract")
@config_options(ExtractConfig, "retry.attempts=3")
@options(ExtractConfig, FLAGS)
@threads_option
def extract(config, sets, threads, **flags):
    """Compute per-token baselines b_t of CHECKPOINT once and store them under STORE/fingerprint=<fp>/."""
    from tokweight.pipeline.data.errors import SampleError, Skips
    from tokweight.pipeline.extract.extract import run
    from tokweight.pipeline.ranks import RankFailed
    from tokweight.store.lock import StoreLockedError

    summary = configured_run(run, ExtractConfig, FLAGS, flags, config, sets, threads,  # OSError: a full disk, I/O
                             errors=(SampleError, StoreLockedError, RankFailed, OSError, ValueError))
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
