"""The `tokweight` command line: one click group; each command builds a config and calls run.

Heavy imports (torch, pyarrow, duckdb) happen inside the commands so that `--help`
stays instant.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def main():
    """Surprisal-share token weighting for latent-strategy CVAEs."""


@main.command()
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Dataset directory to write.")
@click.option("--preset", type=click.Choice(["tiny", "default"]), default="default")
@click.option("--seed", type=int, default=0)
@click.option("--header-len", type=int, default=None, help="Shared header tokens before the strategy output.")
@click.option("--min-len", type=int, default=None)
@click.option("--max-len", type=int, default=None)
def synth(out, preset, seed, header_len, min_len, max_len):
    """Write strategy-ambiguous synthetic WebDataset shards and dataset.json."""
    from dataclasses import replace

    from pipeline.synth import PRESETS, write_dataset

    overrides = {k: v for k, v in dict(header_len=header_len, min_len=min_len, max_len=max_len).items()
                 if v is not None}
    info = write_dataset(replace(PRESETS[preset], seed=seed, **overrides), out)
    click.echo(json.dumps({"out": out, "splits": {k: v["samples"] for k, v in info["splits"].items()},
                           **info["stats"]}, indent=1))


@main.command()
@click.option("--jsonl", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True)
@click.option("--shard-size", type=int, default=1000)
@click.option("--on-bad", type=click.Choice(["error", "skip"]), default="error")
def convert(jsonl, out, shard_size, on_bad):
    """Convert JSON lines ({"x": [...], "y": [...], ...}) into WebDataset shards."""
    from pipeline.convert import convert_jsonl

    try:
        report = convert_jsonl(jsonl, out, shard_size=shard_size, on_bad=on_bad)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    click.echo(json.dumps(report, indent=1, default=str))


@main.command("train-base")
@click.option("--data", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Checkpoint directory.")
@click.option("--preset", type=click.Choice(["tiny", "default"]), default="default")
@click.option("--steps", type=int, default=None)
@click.option("--seed", type=int, default=0)
@click.option("--device", default="cpu")
def train_base(data, out, preset, steps, seed, device):
    """Train the entangled (z-free) base model on S and write a fingerprinted checkpoint."""
    from training.train_base import BASE_PRESETS, BaseTrainConfig, run

    overrides = {"steps": steps} if steps else {}
    cfg = BaseTrainConfig(data=data, out=out, seed=seed, device=device, **{**BASE_PRESETS[preset], **overrides})
    click.echo(json.dumps(run(cfg), indent=1))


@main.command("export-hf")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
def export_hf_cmd(checkpoint, out):
    """Write CHECKPOINT as a directory that transformers.GPT2LMHeadModel loads."""
    from training.export_hf import export_hf

    click.echo(str(export_hf(checkpoint, out)))


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="demo", help="Where everything goes.")
@click.option("--preset", type=click.Choice(["tiny", "default"]), default="default")
@click.option("--seed", type=int, default=0)
def demo(out, preset, seed):
    """The whole pipeline on built-in data: synth -> train-base -> extract -> train -> eval -> inspect."""
    from dataclasses import replace

    from pipeline.synth import PRESETS, write_dataset
    from training.train_base import BASE_PRESETS, BaseTrainConfig, run as train_base_run

    root = Path(out)
    data, ckpt = root / "data", root / "base"
    click.echo(f"[1/2] synth ({preset}) -> {data}")
    write_dataset(replace(PRESETS[preset], seed=seed), data)
    click.echo(f"[2/2] train-base -> {ckpt}")
    base = train_base_run(BaseTrainConfig(data=str(data), out=str(ckpt), seed=seed, **BASE_PRESETS[preset]))
    click.echo(json.dumps(base, indent=1))


from store.inspect_cli import inspect_cmd, sql_cmd  # noqa: E402  (click only; duckdb loads inside)
main.add_command(sql_cmd)
main.add_command(inspect_cmd)
from pipeline.extract_cli import extract  # noqa: E402  (click only; torch loads inside)
main.add_command(extract)
from store.cli import store  # noqa: E402
main.add_command(store)
from training.train_cli import evaluate as eval_cmd, train as train_cmd  # noqa: E402  (click only; torch loads inside)
main.add_command(train_cmd)
main.add_command(eval_cmd)

if __name__ == "__main__":
    main()
