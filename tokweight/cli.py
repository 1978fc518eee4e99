"""The `tokweight` command line: one click group; each command builds its config from the dataclass defaults, a
preset or a configuration file (--config), its flags and --set, in that order (``tokweight.commands.flags``), and calls run.

Heavy imports (torch, pyarrow, duckdb) happen inside the commands so that `--help`
stays instant.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

from tokweight.config_files import preset as preset_file, preset_names
from tokweight.demo_config import DemoConfig
from tokweight.commands.flags import Flag, config_options, configured, options, preset_option
from tokweight.pipeline.data.config import DEFAULT_FRACTION, ON_BAD, ConvertConfig, SynthConfig
from tokweight.pipeline.data.data_option import DataSource
from tokweight.commands.extract import extract
from tokweight.commands.report import evaluate as eval_cmd, inspect_cmd
from tokweight.commands.store import store
from tokweight.commands.sql import sql_cmd
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.training.config.base import BaseTrainConfig
from tokweight.commands.train import train as train_cmd
from tokweight.commands.plan import plan as plan_cmd
from tokweight.commands.experiment import experiment
from tokweight.commands.use import encode as encode_cmd, export as export_cmd, generate as generate_cmd


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


SYNTH_FLAGS = (
    Flag("--seed", "seed"),
    Flag("--header-len", "header_len"),
    Flag("--trailer-len", "trailer_len"),
    Flag("--min-len", "min_len"),
    Flag("--max-len", "max_len"),
)


@main.command()
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Dataset directory to write.")
@preset_option("synth", "A generator preset: tokweight/presets/synth/<name>.toml, the SynthConfig fields it changes.")
@config_options(SynthConfig, "n_train=5000")
@options(SynthConfig, SYNTH_FLAGS, preset_kind="synth")
@click.option("--k", "k", type=click.IntRange(2, 8), default=None,
              help="Strategies: the first K of the preset's kind (pipeline.data.synth.kind_strategies); default: the "
                   "preset's own.")
def synth(out, preset, config, sets, k, **flags):
    """Write strategy-ambiguous synthetic WebDataset shards and dataset.json."""
    from tokweight.pipeline.data.synth import kind_strategies, write_dataset

    chosen, given = preset_file("synth", preset), {}
    if k is not None:
        kind = configured(SynthConfig, (), {}, config, sets, preset=chosen).kind
        given["strategies"] = list(kind_strategies(kind)[:k])
    info = write_dataset(configured(SynthConfig, SYNTH_FLAGS, flags, config, sets, preset=chosen, **given), out)
    click.echo(json.dumps({"out": out, "splits": {k: v["samples"] for k, v in info["splits"].items()},
                           **info["stats"]}, indent=1))


class Columns(click.ParamType):
    """--columns x=question,y=answer -> {"x": "question", "y": "answer"}."""

    name = "columns"

    def convert(self, value, param, ctx) -> dict[str, str]:
        if isinstance(value, dict):
            return value
        pairs = [item.partition("=") for item in value.split(",") if item.strip()]
        if any(not field.strip() or not sep or not column.strip() for field, sep, column in pairs):
            self.fail(f"{value!r}: give FIELD=COLUMN pairs separated by commas, e.g. x=question,y=answer", param, ctx)
        return {field.strip(): column.strip() for field, _, column in pairs}


FRACTION = f"{DEFAULT_FRACTION:g}; not with --split-field"
CONVERT_FLAGS = (
    Flag("--jsonl", "jsonl", "A JSON lines file, one sample per line.", type=click.Path(exists=True, dir_okay=False)),
    Flag("--parquet", "parquet", "A Parquet file or a glob of them (quoted), read row group by row group, instead "
         "of --jsonl."),
    Flag("--columns", "columns", "Parquet columns of the sample fields key, x, y, strategy, t0: x=question,y=answer. "
         "A field not given reads the column of its own name, if there is one.", type=Columns()),
    Flag("--out", "out", "Dataset directory to write: OUT/{train,val,test}/shard-NNNNNN.tar and OUT/dataset.json.",
         type=click.Path(file_okay=False)),
    Flag("--shard-size", "shard_size"),
    Flag("--on-bad", "on_bad", choices=ON_BAD),
    Flag("--val-fraction", "val_fraction", "Share of keys in val/, by a hash of (seed, key): a key keeps its split "
         "when lines are added.", default=FRACTION),
    Flag("--test-fraction", "test_fraction", "Share of keys in test/, likewise; 0 and 0 put every line in train/.",
         default=FRACTION),
    Flag("--seed", "seed", "Salt of the key hash: another seed, another division."),
    Flag("--split-field", "split_field", "Take each line's split from this field (a name of [a-z0-9_-]) instead of "
         "the key hash."),
    Flag("--overwrite", "overwrite"),
)


@main.command()
@config_options(ConvertConfig, "shard_size=500")
@options(ConvertConfig, CONVERT_FLAGS)
def convert(config, sets, **flags):
    """Convert JSON lines ({"x": [...], "y": [...], ...}) or Parquet rows into train/val/test WebDataset shards."""
    from tokweight.pipeline.data.convert import run

    try:
        cfg = configured(ConvertConfig, CONVERT_FLAGS, flags, config, sets)
        info = run(cfg)
    except (ValueError, OSError) as e:  # bad lines, bad options, a folder in use: one line, no traceback
        raise click.ClickException(str(e)) from None
    bad = "bad_lines" if cfg.jsonl is not None else "bad_rows"
    click.echo(json.dumps({"out": cfg.out, "splits": {k: v["samples"] for k, v in info["splits"].items()},
                           bad: info[bad]["count"], "keys_cleaned": len(info["key_map"])}, indent=1))


class ReportTo(click.ParamType):
    """Tracker names, comma-separated ("none": none), as a list."""

    name = "names"

    def convert(self, value, param, ctx) -> list[str]:
        from tokweight.training.config.components import parse_report_to

        if isinstance(value, (list, tuple)):
            return list(value)
        try:
            return list(parse_report_to(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


BASE_FLAGS = (
    Flag("--data", "data", type=DataSource()),
    Flag("--out", "out", type=click.Path(file_okay=False)),
    Flag("--steps", "steps"),
    Flag("--seed", "seed"),
    Flag("--k-max", "k_max"),
    Flag("--min-slots", "min_slots"),
    Flag("--device", "device"),
    Flag("--report-to", "report_to", "Trackers that get the metrics lines and the configuration, comma-separated: "
         "tensorboard, mlflow, wandb (offline, in the checkpoint directory; each needs pip install "
         "'tokweight[NAME]').", default="none", type=ReportTo()),
)


@main.command("train-base")
@preset_option("base", "A base-model preset: tokweight/presets/base/<name>.toml, the BaseTrainConfig fields it "
                       "changes.")
@config_options(BaseTrainConfig, "n_layer=3")
@options(BaseTrainConfig, BASE_FLAGS, preset_kind="base")
@threads_option
def train_base(preset, config, sets, threads, **flags):
    """Train the entangled (z-free) base model on S and write a fingerprinted checkpoint."""
    from tokweight.training.loop.train_base import memorised_line, run

    set_threads(threads)
    try:
        result = run(configured(BaseTrainConfig, BASE_FLAGS, flags, config, sets, preset=preset_file("base", preset)))
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
    from tokweight.training.export.checkpoint import export_hf

    click.echo(str(export_hf(checkpoint, out)))


DEMO_FLAGS = (
    Flag("--out", "out", type=click.Path(file_okay=False)),
    Flag("--preset", "preset", "default: the claim, in a few minutes on 2 CPU cores; tiny: seconds, an installation "
         "check.", choices=tuple(preset_names("demo"))),
    Flag("--seed", "seed"),
)


@main.command()
@config_options(DemoConfig, "seed=1")
@options(DemoConfig, DEMO_FLAGS)
@threads_option
def demo(config, sets, threads, **flags):
    """The method's claim on built-in data: synth -> base model -> store -> uniform and surprisal-share CVAEs
    from scratch under the defaults -> eval against the base -> a table and what it shows."""
    from tokweight.demo import run

    set_threads(threads)
    cfg = configured(DemoConfig, DEMO_FLAGS, flags, config, sets)
    result = run(cfg)
    click.echo((Path(cfg.out) / "demo.md").read_text())
    click.echo(f"report: {result['report']}")


for command in (extract, store, sql_cmd, inspect_cmd, train_cmd, plan_cmd, eval_cmd, generate_cmd, encode_cmd,
                export_cmd,
                experiment):
    main.add_command(command)

if __name__ == "__main__":
    main()
