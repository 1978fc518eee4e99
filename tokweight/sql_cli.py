"""`tokweight sql`: SQL over a baseline store (`tokweight inspect` is tokweight/report_cli.py).

DuckDB, pyarrow and matplotlib are imported inside the commands so that `--help` stays fast.
A bad query or store is a click error carrying DuckDB's (or the store's) message, never a
traceback.
"""

from __future__ import annotations

import csv
import json
import sys

import click

store_argument = click.argument("store", type=click.Path(exists=True, file_okay=False))
fingerprint_option = click.option("--fingerprint", "fingerprints", multiple=True,
                                help="Fingerprint to open (repeatable); default: every one in the store.")

exact_quantiles_option = click.option(
    "--exact-quantiles", is_flag=True,
    help="Every example in tokens.in_quantile_sample, so profile_by_position's quantiles are exact "
         "whatever the store's size (slower above 2^20 tokens).")


def estimator_options(f):
    for opt in reversed([
        click.option("--q", type=float, default=0.9, help="Cumulative share for t0_share."),
        click.option("--tau", type=float, default=0.1, help="Surprisal threshold (nats) for t0_threshold."),
        click.option("--eps", type=float, default=1e-6, help="Examples with sum b < eps are degenerate."),
    ]):
        f = opt(f)
    return f


@click.command("sql")
@store_argument
@click.argument("query", required=False)
@fingerprint_option
@estimator_options
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the result here (parquet needs it).")
@click.option("--max-rows", type=int, default=40, help="Rows shown by --format table.")
@exact_quantiles_option
@click.option("--run", "run_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="A train run whose posteriors-<split>.parquet files (`tokweight encode`) become the view "
                   "posteriors, joined with examples by key.")
def sql_cmd(store, query, fingerprints, q, tau, eps, fmt, out, max_rows, exact_quantiles, run_dir):
    """Run QUERY over STORE's views (examples, tokens, vocab, manifests; posteriors with --run); no QUERY: show
    them."""
    import duckdb

    from tokweight.store.sql import QUANTILE_TOKENS, add_posteriors, connect, describe
    from tokweight.store.sql_config import EstimatorParams
    from tokweight.training.control import ONE_STRATEGY

    try:
        con = connect(store, fingerprints, EstimatorParams(q=q, tau=tau, eps=eps),
                      quantile_tokens=None if exact_quantiles else QUANTILE_TOKENS)
        if run_dir is not None:
            add_posteriors(con, run_dir, ONE_STRATEGY)
        if query is None:
            click.echo(describe(con))
            return
        rel = con.sql(query)
        if rel is None:  # a statement without a result (SET, CREATE ...)
            return
        _emit(rel, fmt, out, max_rows)
    except (duckdb.Error, ValueError, KeyError, FileNotFoundError) as e:
        raise click.ClickException(str(e).strip("'\"")) from None


def _emit(rel, fmt: str, out: str | None, max_rows: int) -> None:
    """Write a DuckDB relation in the chosen format to ``out`` or stdout."""
    if fmt == "parquet":
        if out is None:
            raise click.UsageError("--format parquet needs --out FILE")
        rel.write_parquet(out)
    elif fmt == "csv":
        if out is not None:
            rel.write_csv(out)
        else:
            writer = csv.writer(sys.stdout, lineterminator="\n")
            writer.writerow(rel.columns)
            writer.writerows(rel.fetchall())
    elif fmt == "json":
        text = json.dumps(rel.to_arrow_table().to_pylist(), default=str, indent=1)
        if out is not None:
            with open(out, "w") as f:
                f.write(text + "\n")
        else:
            click.echo(text)
    elif out is not None:
        with open(out, "w") as f:
            f.write(str(rel) + "\n")
    else:
        rel.show(max_rows=max_rows, max_width=200)
