"""`tokweight inspect` and `tokweight eval`: the commands whose reports the reporting layer renders.

Each builds its config, calls the layer below for plain data, and writes the report from it. Heavy
imports (torch, DuckDB, matplotlib) stay inside the commands so that `--help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from tokweight.sql_cli import estimator_options, exact_quantiles_option, fingerprint_option, store_argument
from tokweight.pipeline.data_option import DataSource
from tokweight.pipeline.threads import set_threads, threads_option
from tokweight.use_cli import dtype_option
from tokweight.train_cli import echo_skips, given


@click.command("inspect")
@store_argument
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--data", type=DataSource(), default=None,
              help="The dataset the store was extracted from: fills in ground truth (strategy, t0) the store lacks.")
@fingerprint_option
@estimator_options
@exact_quantiles_option
def inspect_cmd(store, out, data, fingerprints, q, tau, eps, exact_quantiles):
    """Write OUT/report.md, PNG plots and OUT/summary.json: t0 estimates and weight diagnostics."""
    import duckdb

    from tokweight.report.inspect_config import InspectConfig
    from tokweight.report.inspect import run

    try:
        cfg = InspectConfig(store=store, out=out, data=data, fingerprints=tuple(fingerprints), q=q, tau=tau, eps=eps,
                            exact_quantiles=exact_quantiles)
        run(cfg)
    except (duckdb.Error, ValueError, KeyError, FileNotFoundError) as e:
        raise click.ClickException(str(e).strip("'\"")) from None
    click.echo(f"report: {out}/report.md")


@click.command("eval")
@click.option("--run", "run_dir", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--data", type=DataSource(), required=True)
@click.option("--split", default="test")
@click.option("--decode-examples", type=int, default=256)
@click.option("--device", default=None, help="auto (CUDA when present), cpu, cuda or cuda:N.  [default: auto]")
@dtype_option
@threads_option
def evaluate(run_dir, data, split, decode_examples, device, dtype, threads):
    """All metrics on a split plus decode-per-latent -> RUN/eval.json and RUN/eval.md."""
    from tokweight.report.eval_md import write_eval_md
    from tokweight.report.plots import save_figures
    from tokweight.report.run_plots import plot_strategies
    from tokweight.training.use_config import EvalConfig
    from tokweight.training.evaluate import run_eval

    set_threads(threads)
    try:
        result = run_eval(EvalConfig(run=run_dir, data=data, split=split, decode_examples=decode_examples,
                                     **given(device=device, dtype=dtype)))
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    if "reason" in result["baseline"]:
        click.echo(f"note: {result['baseline']['reason']}", err=True)
    echo_skips(result["metrics"])
    click.echo(write_eval_md(run_dir, result).read_text())
    save_figures({"strategies.png": plot_strategies(result)}, Path(run_dir))
    click.echo(json.dumps(result["metrics"], indent=1))
