"""The `tokweight` command line: one click group; each command builds a config and calls run.

Heavy imports (torch, pyarrow, duckdb) happen inside the commands so that `--help`
stays instant.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from tokweight.pipeline.data_option import DataSource
from tokweight.config_files import preset_config, preset_names
from tokweight.extract_cli import extract
from tokweight.report_cli import evaluate as eval_cmd, inspect_cmd
from tokweight.store_cli import store
from tokweight.sql_cli import sql_cmd
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.train_cli import train as train_cmd
from tokweight.plan_cli import plan as plan_cmd
from tokweight.experiment_cli import experiment
from tokweight.use_cli import encode as encode_cmd, export as export_cmd, generate as generate_cmd


OUTPUT_OPTIONS = ("--out", "--store")  # what a command creates; a failed one leaves no empty one behind


def one_line(error: Exception) -> str:
    """The error as one line: its message (each names the file, the key and what to do), whitespace folded."""
    return " ".join(str(error).strip("'\"").split()) or type(error).__name__


def new_output_dirs(args: list[str]) -> list[Path]:
    """The command's output directories that do not exist yet."""
    paths = [Path(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg in OUTPUT_OPTIONS]
    return [p for p in paths if not p.exists()]


def remove_if_empty(path: Path) -> None:
    """Remove ``path`` if it holds nothing but empty directories."""
    if path.is_dir() and not any(p.is_file() for p in path.rglob("*")):
        shutil.rmtree(path)


class OneLineErrors(click.Group):
    """Every failure of a command is one line on stderr, `Error: <what>`, and exit status 1; the
    traceback only with `tokweight --debug`. Output directories the failed command created and
    left empty are removed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["tokweight.args"] = list(args)  # the whole command line, the subcommand's options included
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        created = new_output_dirs(ctx.meta.get("tokweight.args", []))
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as error:
            for path in created:
                remove_if_empty(path)
            if isinstance(error, click.ClickException) or ctx.params.get("debug"):
                raise
            raise click.ClickException(one_line(error)) from None


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--debug", is_flag=True, help="Show the traceback of a failure instead of one line.")
def main(debug):
    """Surprisal-share token weighting for latent-strategy CVAEs."""


@main.command()
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Dataset directory to write.")
@click.option("--preset", type=click.Choice(preset_names("synth")), default="default",
              help="A generator preset: tokweight/presets/synth/<name>.toml, the SynthConfig fields it changes.")
@click.option("--seed", type=int, default=0)
@click.option("--header-len", type=int, default=None, help="Shared header tokens before the strategy output.")
@click.option("--trailer-len", type=int, default=None,
              help="Shared trailer tokens after it: a longer y decided as early (T/(t0+1) grows).")
@click.option("--min-len", type=int, default=None)
@click.option("--max-len", type=int, default=None)
@click.option("--k", "k", type=click.IntRange(2, 8), default=None,
              help="Strategies: the first K of the preset's kind (pipeline.synth.kind_strategies); default: the "
                   "preset's own.")
def synth(out, preset, seed, header_len, trailer_len, min_len, max_len, k):
    """Write strategy-ambiguous synthetic WebDataset shards and dataset.json."""
    from tokweight.pipeline.data_config import SynthConfig
    from tokweight.pipeline.synth import kind_strategies, write_dataset

    overrides = {k: v for k, v in dict(header_len=header_len, trailer_len=trailer_len, min_len=min_len,
                                       max_len=max_len).items() if v is not None}
    if k is not None:
        overrides["strategies"] = list(kind_strategies(preset_config(SynthConfig, "synth", preset).kind)[:k])
    info = write_dataset(preset_config(SynthConfig, "synth", preset, seed=seed, **overrides), out)
    click.echo(json.dumps({"out": out, "splits": {k: v["samples"] for k, v in info["splits"].items()},
                           **info["stats"]}, indent=1))


def parse_columns(ctx, param, value: str | None) -> dict[str, str]:
    """--columns x=question,y=answer -> {"x": "question", "y": "answer"}."""
    pairs = [item.partition("=") for item in (value or "").split(",") if item.strip()]
    if any(not field.strip() or not sep or not column.strip() for field, sep, column in pairs):
        raise click.BadParameter(f"{value!r}: give FIELD=COLUMN pairs separated by commas, e.g. x=question,y=answer")
    return {field.strip(): column.strip() for field, _, column in pairs}


@main.command()
@click.option("--jsonl", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A JSON lines file, one sample per line.")
@click.option("--parquet", default=None,
              help="A Parquet file or a glob of them (quoted), read row group by row group, instead of --jsonl.")
@click.option("--columns", callback=parse_columns, default=None,
              help="Parquet columns of the sample fields key, x, y, strategy, t0: x=question,y=answer. "
                   "A field not given reads the column of its own name, if there is one.")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Dataset directory to write: OUT/{train,val,test}/shard-NNNNNN.tar and OUT/dataset.json.")
@click.option("--shard-size", type=int, default=1000)
@click.option("--on-bad", type=click.Choice(["error", "skip"]), default="error",
              help="A bad line: stop before writing anything, naming it by line number; or skip it and list it.")
@click.option("--val-fraction", type=float, default=None,
              help="Share of keys in val/, by a hash of (seed, key): a key keeps its split when lines are added."
                   "  [default: 0.1; not with --split-field]")
@click.option("--test-fraction", type=float, default=None,
              help="Share of keys in test/, likewise; 0 and 0 put every line in train/."
                   "  [default: 0.1; not with --split-field]")
@click.option("--seed", type=int, default=0, help="Salt of the key hash: another seed, another division.")
@click.option("--split-field", default=None,
              help="Take each line's split from this field (a name of [a-z0-9_-]) instead of the key hash.")
@click.option("--overwrite", is_flag=True, help="Replace the dataset OUT already holds.")
def convert(jsonl, parquet, columns, out, shard_size, on_bad, val_fraction, test_fraction, seed, split_field,
            overwrite):
    """Convert JSON lines ({"x": [...], "y": [...], ...}) or Parquet rows into train/val/test WebDataset shards."""
    from tokweight.pipeline.data_config import ConvertConfig
    from tokweight.pipeline.convert import run

    try:
        info = run(ConvertConfig(jsonl=jsonl, out=out, shard_size=shard_size, on_bad=on_bad,
                                 val_fraction=val_fraction, test_fraction=test_fraction, seed=seed,
                                 split_field=split_field, overwrite=overwrite, parquet=parquet, columns=columns))
    except (ValueError, OSError) as e:  # bad lines, bad options, a folder in use: one line, no traceback
        raise click.ClickException(str(e)) from None
    bad = "bad_lines" if jsonl is not None else "bad_rows"
    click.echo(json.dumps({"out": out, "splits": {k: v["samples"] for k, v in info["splits"].items()},
                           bad: info[bad]["count"], "keys_cleaned": len(info["key_map"])}, indent=1))


@main.command("train-base")
@click.option("--data", type=DataSource(), required=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Checkpoint directory.")
@click.option("--preset", type=click.Choice(preset_names("base")), default="default",
              help="A base-model preset: tokweight/presets/base/<name>.toml, the BaseTrainConfig fields it changes.")
@click.option("--steps", type=int, default=None)
@click.option("--seed", type=int, default=0)
@click.option("--k-max", type=int, default=8,
              help="Latent tokens <z_0>..<z_{N-1}> the base model learns to read as \"a z goes here\" (train appends "
                   "more when a CVAE's --k needs them).")
@click.option("--min-slots", type=int, default=None,
              help="Fewest latent slots of the z-conditioned sequences, drawn from here to the slots reserved (default: "
                   "from 1, every count): 4 trains only the count train's prefix reads, which a long y needs "
                   "(docs/results.md, \"T/(t0+1) = 64\").")
@click.option("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N.")
@click.option("--report-to", "report_to", default=None,
              help="Trackers that get the metrics lines and the configuration, comma-separated: tensorboard, mlflow, "
                   "wandb (offline, in the checkpoint directory; each needs pip install 'tokweight[NAME]').  "
                   "[default: none]")
@threads_option
def train_base(data, out, preset, steps, seed, k_max, min_slots, device, report_to, threads):
    """Train the entangled (z-free) base model on S and write a fingerprinted checkpoint."""
    from tokweight.training.base_config import BaseTrainConfig
    from tokweight.training.train_base import memorised_line, run

    set_threads(threads)
    from tokweight.training.trackers import parse_report_to

    overrides = ({"steps": steps} if steps else {}) | ({"min_slots": min_slots} if min_slots is not None else {})
    try:
        overrides |= {"report_to": parse_report_to(report_to)} if report_to else {}
        cfg = preset_config(BaseTrainConfig, "base", preset, data=data, out=out, seed=seed, k_max=k_max,
                            device=device, **overrides)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    try:
        result = run(cfg)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    click.echo(json.dumps(result, indent=1))
    if line := memorised_line(result["train_nll"], result["val_nll"]):
        click.echo(line, err=True)


@main.command("export-hf")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
def export_hf_cmd(checkpoint, out):
    """Write CHECKPOINT as a directory that transformers.GPT2LMHeadModel loads."""
    from tokweight.training.export_hf import export_hf

    click.echo(str(export_hf(checkpoint, out)))


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="demo", help="Where everything goes.")
@click.option("--preset", type=click.Choice(preset_names("demo")), default="default",
              help="default: the claim, in a few minutes on 2 CPU cores; tiny: seconds, an installation check.")
@click.option("--seed", type=int, default=0)
@threads_option
def demo(out, preset, seed, threads):
    """The method's claim on built-in data: synth -> base model -> store -> uniform and surprisal-share CVAEs
    from scratch under the defaults -> eval against the base -> a table and what it shows."""
    from tokweight.demo_config import DemoConfig
    from tokweight.demo import run

    set_threads(threads)
    result = run(DemoConfig(out=out, preset=preset, seed=seed))
    click.echo((Path(out) / "demo.md").read_text())
    click.echo(f"report: {result['report']}")


for command in (extract, store, sql_cmd, inspect_cmd, train_cmd, plan_cmd, eval_cmd, generate_cmd, encode_cmd,
                export_cmd,
                experiment):
    main.add_command(command)

if __name__ == "__main__":
    main()
