"""`tokweight inspect`: build the config, call ``pipeline.inspect.run``. Heavy imports stay inside."""

from __future__ import annotations

import click

from tokweight.store.inspect_cli import estimator_options, exact_quantiles_option, fingerprint_option, store_argument


@click.command("inspect")
@store_argument
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--data", type=click.Path(exists=True, file_okay=False), default=None,
              help="The dataset the store was extracted from: fills in ground truth (strategy, t0) the store lacks.")
@fingerprint_option
@estimator_options
@exact_quantiles_option
def inspect_cmd(store, out, data, fingerprints, q, tau, eps, exact_quantiles):
    """Write OUT/report.md, PNG plots and OUT/summary.json: t0 estimates and weight diagnostics."""
    import duckdb

    from tokweight.pipeline.inspect import run
    from tokweight.store.report import InspectConfig

    try:
        cfg = InspectConfig(store=store, out=out, data=data, fingerprints=tuple(fingerprints), q=q, tau=tau, eps=eps,
                            exact_quantiles=exact_quantiles)
        run(cfg)
    except (duckdb.Error, ValueError, KeyError, FileNotFoundError) as e:
        raise click.ClickException(str(e).strip("'\"")) from None
    click.echo(f"report: {out}/report.md")
