"""`tokweight sql`: schemas without a query, output formats, DuckDB's message for a bad query."""

from __future__ import annotations

import csv
import io
import json

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tokweight.cli import main
from tests.support.fixtures_sql import example_rows, write_store

FP = "c" * 32


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_store")
    write_store(root, FP, example_rows(4, 25))
    return root


def _sql(*args):
    return CliRunner().invoke(main, ["sql", *map(str, args)])


def test_no_query_prints_views_and_examples(store):
    result = _sql(store)
    assert result.exit_code == 0, result.output
    for text in ("examples:", "tokens:", "vocab:", "manifests:", "t0_share", "effective_tokens", "example queries:"):
        assert text in result.output


def test_csv_json_parquet(store, tmp_path):
    query = "SELECT key, T, t0_share FROM examples ORDER BY key LIMIT 5"
    rows = list(csv.DictReader(io.StringIO(_sql(store, query, "--format", "csv").output)))
    assert [r["key"] for r in rows] == [f"k{i:05d}" for i in range(5)]
    records = json.loads(_sql(store, query, "--format", "json").output)
    assert [r["key"] for r in records] == [r["key"] for r in rows]
    assert [str(r["T"]) for r in records] == [r["T"] for r in rows]
    out = tmp_path / "r.parquet"
    assert _sql(store, query, "--format", "parquet", "--out", out).exit_code == 0
    assert pq.read_table(out).column("key").to_pylist() == [r["key"] for r in rows]
    assert _sql(store, query, "--format", "parquet").exit_code == 2  # needs --out


def test_variables_change_the_estimators(store):
    query = "SELECT sum(t0_share) AS s FROM examples"
    low = json.loads(_sql(store, "SET VARIABLE q = 0.25; " + query, "--format", "json").output)[0]["s"]
    high = json.loads(_sql(store, query, "--q", "1.0", "--format", "json").output)[0]["s"]
    assert low < high


@pytest.mark.parametrize("query, message", [
    ("SELECT nonsense FROM examples", "Binder Error"),
    ("SELEC 1", "Parser Error"),
    ("SELECT * FROM no_such_view", "Catalog Error"),
])
def test_bad_query_gets_duckdbs_message(store, query, message):
    result = _sql(store, query)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


def test_unknown_fingerprint_is_a_clean_error(store):
    result = _sql(store, "SELECT 1", "--fingerprint", "d" * 32)
    assert result.exit_code == 1 and "d" * 32 in result.output and "Traceback" not in result.output


def test_exact_quantiles_flag_puts_every_example_in_the_quantile_sample(store, monkeypatch):
    monkeypatch.setattr("tokweight.store.sql.QUANTILE_TOKENS", 10)  # this small store then samples its quantiles
    query = [("SELECT getvariable('quantile_share') AS share, count(*) FILTER (in_quantile_sample) AS kept, "
             "count(*) AS n FROM tokens"), "--format", "json"]
    (sampled,) = json.loads(_sql(store, *query).output)
    (exact,) = json.loads(_sql(store, *query, "--exact-quantiles").output)
    assert sampled["share"] < 1 and sampled["kept"] < sampled["n"]
    assert exact["share"] == 1 and exact["kept"] == exact["n"]
