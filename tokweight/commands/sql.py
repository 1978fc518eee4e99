"""`tokweight sql`: SQL over a baseline store (`tokweight inspect` is tokweight/commands/report.py), its options the
fields of ``SqlConfig``.

DuckDB, pyarrow and matplotlib are imported inside the commands so that `--help` stays fast.
A bad query or store is a click error carrying DuckDB's (or the store's) message, never a
traceback.
"""

from __future__ import annotations

import csv
import json
import sys

import click

from tokweight.commands.flags import Flag, config_options, configured, options
from tokweight.store.sql_config import SQL_FORMATS, SqlConfig

store_argument = click.argument("store", type=click.Path(exists=True, file_okay=False))

ESTIMATOR_FLAGS = (Flag("--q", "q"), Flag("--tau", "tau"), Flag("--eps", "eps"))
"""The estimators' parameters, which `tokweight inspect` takes too."""
FLAGS = (
    Flag("--fingerprint", "fingerprints", multiple=True),
    *ESTIMATOR_FLAGS,
    Flag("--format", "format", choices=SQL_FORMATS),
    Flag("--out", "out", type=click.Path(dir_okay=False)),
    Flag("--max-rows", "max_rows"),
    Flag("--exact-quantiles", "exact_quantiles"),
    Flag("--run", "run", type=click.Path(exists=True, file_okay=False)),
)


@click.command("sql")
@store_argument
@click.argument("query", required=False)
@config_options(SqlConfig, "max_rows=100")
@options(SqlConfig, FLAGS)
def sql_cmd(store, query, config, sets, **flags):
    """Run QUERY over STORE's views (examples, tokens, vocab, manifests; posteriors with --run); no QUERY: show
    them."""
    import duckdb

    from tokweight.store.sql import QUANTILE_TOKENS, add_posteriors, connect, describe
    from tokweight.training.evaluation.verdict import ONE_STRATEGY

    try:
        cfg = configured(SqlConfig, FLAGS, flags, config, sets, store=store,
                         **({} if query is None else {"query": query}))
        con = connect(cfg.store, cfg.fingerprints, cfg.params,
                      quantile_tokens=None if cfg.exact_quantiles else QUANTILE_TOKENS)
        if cfg.run is not None:
            add_posteriors(con, cfg.run, ONE_STRATEGY)
        if cfg.query is None:
            click.echo(describe(con))
            return
        rel = con.sql(cfg.query)
        if rel is None:  # a statement without a result (SET, CREATE ...)
            return
        _emit(rel, cfg.format, cfg.out, cfg.max_rows)
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
