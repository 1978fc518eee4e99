"""`tokweight inspect` and `tokweight eval`: the commands whose reports the reporting layer renders.

Each builds its config from the defaults, a configuration file, the flags and ``--set``, in that order, calls the
layer below for plain data, and writes the report from it. Heavy imports (torch, DuckDB, matplotlib) stay inside
the commands so that `--help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from tokweight.commands.flags import Flag, config_options, configured, options
from tokweight.pipeline.data.data_option import DataSource
from tokweight.pipeline.models.dtypes import DTYPE_CHOICES
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.report.inspect_config import InspectConfig
from tokweight.commands.sql import ESTIMATOR_FLAGS, store_argument
from tokweight.commands.train import echo_skips
from tokweight.training.config.use import EvalConfig

INSPECT_FLAGS = (
    Flag("--out", "out", type=click.Path(file_okay=False)),
    Flag("--data", "data", "The dataset the store was extracted from: fills in ground truth (strategy, t0) the store "
         "lacks.", type=DataSource()),
    Flag("--fingerprint", "fingerprints", multiple=True),
    *ESTIMATOR_FLAGS,
    Flag("--exact-quantiles", "exact_quantiles"),
)
EVAL_FLAGS = (
    Flag("--run", "run", type=click.Path(exists=True, file_okay=False)),
    Flag("--data", "data", type=DataSource()),
    Flag("--split", "split"),
    Flag("--decode-examples", "decode_examples"),
    Flag("--device", "device"),
    Flag("--dtype", "dtype", choices=DTYPE_CHOICES),
)


@click.command("inspect")
@store_argument
@config_options(InspectConfig, "tau=0.2")
@options(InspectConfig, INSPECT_FLAGS)
def inspect_cmd(store, config, sets, **flags):
    """Write OUT/report.md, PNG plots and OUT/summary.json: t0 estimates and weight diagnostics."""
    import duckdb

    from tokweight.report.inspect import run

    try:
        cfg = configured(InspectConfig, INSPECT_FLAGS, flags, config, sets, store=store)
        run(cfg)
    except (duckdb.Error, ValueError, KeyError, FileNotFoundError) as e:
        raise click.ClickException(str(e).strip("'\"")) from None
    click.echo(f"report: {cfg.out}/report.md")


@click.command("eval")
@config_options(EvalConfig, "batch_size=64")
@options(EvalConfig, EVAL_FLAGS)
@threads_option
def evaluate(config, sets, threads, **flags):
    """All metrics on a split plus decode-per-latent -> RUN/eval.json and RUN/eval.md."""
    from tokweight.report.eval_md import write_eval_md
    from tokweight.report.plots import save_figures
    from tokweight.report.run_plots import plot_strategies
    from tokweight.training.evaluation.evaluate import run_eval

    set_threads(threads)
    try:
        cfg = configured(EvalConfig, EVAL_FLAGS, flags, config, sets)
        result = run_eval(cfg)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    if "reason" in result["baseline"]:
        click.echo(f"note: {result['baseline']['reason']}", err=True)
    echo_skips(result["metrics"])
    click.echo(write_eval_md(cfg.run, result).read_text())
    save_figures({"strategies.png": plot_strategies(result)}, Path(cfg.run))
    click.echo(json.dumps(result["metrics"], indent=1))
