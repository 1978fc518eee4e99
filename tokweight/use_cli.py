"""`tokweight generate` and `tokweight encode`: use a trained CVAE. Build the config, call run; heavy imports
stay inside."""

from __future__ import annotations

import json

import click

from tokweight.pipeline.data_option import DataSource
from tokweight.pipeline.dtypes import DTYPE_CHOICES
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.train_cli import echo_skips, given

run_option = click.option("--run", "run_dir", type=click.Path(exists=True, file_okay=False), required=True,
                          help="The train run directory (its checkpoint/).")
device_option = click.option("--device", default=None,
                             help="auto (CUDA when present), cpu, cuda or cuda:N.  [default: auto]")
dtype_option = click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default=None,
                            help="The weights' and the forward's dtype; the log-softmax and the posterior run in "
                                 "float32.  [default: auto, bfloat16 on CUDA, float32 elsewhere]")


@click.command("generate")
@run_option
@click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False), required=True,
              help='JSON lines {"key"?: ..., "x": ...}: x a list of symbols, or a string for a run with a tokenizer.')
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help='JSON lines {"line", "key", "outputs": [K outputs]}, in x\'s own form.')
@click.option("--temperature", type=float, default=None, help="0: greedy; > 0: sampling.  [default: 0]")
@click.option("--seed", type=int, default=None, help="Seed of the sampling draws.  [default: 0]")
@click.option("--max-new-tokens", type=int, default=None,
              help="Tokens of y at most (fewer where the context ends first).  [default: 256]")
@click.option("--data", type=DataSource(), default=None,
              help="Continuous latent: the dataset whose split's posterior means give the K centres, as eval.")
@click.option("--split", default=None, help="Split of --data for the centres.  [default: test]")
@click.option("--batch-size", type=int, default=None, help="Input lines decoded together.  [default: 64]")
@device_option
@dtype_option
@threads_option
def generate(run_dir, input_path, out, temperature, seed, max_new_tokens, data, split, batch_size, device, dtype,
             threads):
    """One output per latent value for every input line (greedy, or sampled at --temperature)."""
    from tokweight.training.use_config import GenerateConfig
    from tokweight.training.generate import run

    set_threads(threads)
    try:
        result = run(GenerateConfig(run=run_dir, input=input_path, out=out, data=data,
                                    **given(temperature=temperature, seed=seed, split=split, batch_size=batch_size,
                                            device=device, dtype=dtype, max_new_tokens=max_new_tokens)))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    click.echo(json.dumps(result, indent=1))


@click.command("encode")
@run_option
@click.option("--data", type=DataSource(), required=True)
@click.option("--split", default=None, help="[default: test]")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Parquet file.  [default: RUN/posteriors-<split>.parquet, the view posteriors of "
                   "`tokweight sql STORE --run RUN`]")
@click.option("--batch-size", type=int, default=None, help="[default: 128]")
@device_option
@dtype_option
@threads_option
def encode(run_dir, data, split, out, batch_size, device, dtype, threads):
    """Every example's posterior over a split (q, or mu and sigma; its latent value) -> a Parquet file."""
    from tokweight.training.use_config import EncodeConfig
    from tokweight.training.encode import run

    set_threads(threads)
    try:
        result = run(EncodeConfig(run=run_dir, data=data, out=out,
                                  **given(split=split, batch_size=batch_size, device=device, dtype=dtype)))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    echo_skips(result)
    click.echo(json.dumps(result, indent=1))


@click.command("export")
@run_option
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Directory to write: export.json and the model directories transformers loads.")
@click.option("--data", type=DataSource(), default=None,
              help="Continuous latent: the dataset whose split's posterior means give the K centres, as generate.")
@click.option("--split", default=None, help="Split of --data for the centres.  [default: test]")
@threads_option
def export(run_dir, out, data, split, threads):
    """A trained CVAE as stock transformers models, one per latent value (token, prefix, query, layernorm)."""
    from tokweight.training.use_config import ExportConfig
    from tokweight.training.export import run

    set_threads(threads)
    try:
        result = run(ExportConfig(run=run_dir, out=out, data=data, **given(split=split)))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    click.echo(json.dumps(result, indent=1))
