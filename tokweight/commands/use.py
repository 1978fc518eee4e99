"""`tokweight generate`, `encode` and `export`: use a trained CVAE. Each builds its config from the defaults, a
configuration file, the flags and ``--set``, in that order, and calls run; heavy imports stay inside."""

from __future__ import annotations

import json

import click

from tokweight.commands.flags import Flag, config_options, configured_run, options
from tokweight.pipeline.data.data_option import DataSource
from tokweight.pipeline.models.dtypes import DTYPE_CHOICES
from tokweight.pipeline.threads import threads_option
from tokweight.commands.train import echo_skips
from tokweight.training.config.use import EncodeConfig, ExportConfig, GenerateConfig

RUN = Flag("--run", "run", "The train run directory (its checkpoint/).", type=click.Path(exists=True, file_okay=False))
DEVICE = Flag("--device", "device")
DTYPE = Flag("--dtype", "dtype", choices=DTYPE_CHOICES)
CENTRES = (Flag("--data", "data", type=DataSource()), Flag("--split", "split", "Split of --data for the centres."))

GENERATE_FLAGS = (
    RUN,
    Flag("--input", "input", 'JSON lines {"key"?: ..., "x": ...}: x a list of symbols, or a string for a run with a '
         "tokenizer.", type=click.Path(exists=True, dir_okay=False)),
    Flag("--out", "out", 'JSON lines {"line", "key", "outputs": [K outputs]}, in x\'s own form.',
         type=click.Path(dir_okay=False)),
    Flag("--temperature", "temperature"),
    Flag("--seed", "seed"),
    Flag("--max-new-tokens", "max_new_tokens"),
    *CENTRES,
    Flag("--batch-size", "batch_size"),
    DEVICE,
    DTYPE,
)
ENCODE_FLAGS = (
    RUN,
    Flag("--data", "data", type=DataSource()),
    Flag("--split", "split"),
    Flag("--out", "out", type=click.Path(dir_okay=False),
         default="RUN/posteriors-<split>.parquet, the view posteriors of `tokweight sql STORE --run RUN`"),
    Flag("--batch-size", "batch_size"),
    DEVICE,
    DTYPE,
)
EXPORT_FLAGS = (
    RUN,
    Flag("--out", "out", type=click.Path(file_okay=False)),
    *CENTRES,
)


@click.command("generate")
@config_options(GenerateConfig, "max_new_tokens=64")
@options(GenerateConfig, GENERATE_FLAGS)
@threads_option
def generate(config, sets, threads, **flags):
    """One output per latent value for every input line (greedy, or sampled at --temperature)."""
    from tokweight.training.decoding.generate import run

    click.echo(json.dumps(configured_run(run, GenerateConfig, GENERATE_FLAGS, flags, config, sets, threads), indent=1))


@click.command("encode")
@config_options(EncodeConfig, "batch_size=64")
@options(EncodeConfig, ENCODE_FLAGS)
@threads_option
def encode(config, sets, threads, **flags):
    """Every example's posterior over a split (q, or mu and sigma; its latent value) -> a Parquet file."""
    from tokweight.training.decoding.encode import run

    result = configured_run(run, EncodeConfig, ENCODE_FLAGS, flags, config, sets, threads)
    echo_skips(result)
    click.echo(json.dumps(result, indent=1))


@click.command("export")
@config_options(ExportConfig, "batch_size=32")
@options(ExportConfig, EXPORT_FLAGS)
@threads_option
def export(config, sets, threads, **flags):
    """A trained CVAE as stock transformers models, one per latent value (token, prefix, query, layernorm)."""
    from tokweight.training.export.cvae import run

    click.echo(json.dumps(configured_run(run, ExportConfig, EXPORT_FLAGS, flags, config, sets, threads), indent=1))
