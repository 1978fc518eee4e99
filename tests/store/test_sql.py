"""store.sql: every estimator against a numpy reference, views over manifest-listed parts only."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokweight.store.sql_config import EstimatorParams
from tokweight.store.sql import connect, read_sql
from tests.support.fixtures_sql import TIE_VALUES, VOCAB, example_rows, make_row, write_store

FP = "f" * 32


# ---------------------------------------------------------------- numpy references (float64 throughout)


def ref_t0_share(row, q, eps):
    if row["b_sum"] < eps:
        return None
    hits = np.nonzero(row["cumsum_b"].astype(np.float64) >= q * row["b_sum"])[0]
    return int(hits[0]) if hits.size else row["T"] - 1


def ref_t0_threshold(row, tau):
    above = np.nonzero(row["b"].astype(np.float64) > tau)[0]
    return int(above[-1]) if above.size else None


def ref_concentration(row, eps):
    if row["b_sum"] < eps:
        return None, None, None
    pi = row["b"].astype(np.float64) / row["b_sum"]
    positive = pi[pi > 0]
    return float(-np.sum(positive * np.log(positive))), float(1.0 / np.sum(pi**2)), float(pi.max())


def _close(a, b):
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------- per-example estimators

_b = st.lists(st.sampled_from(TIE_VALUES.tolist()), min_size=1, max_size=9)
_example = st.one_of(_b, st.integers(1, 6).map(lambda T: [0.0] * T), st.just([1.0]), st.just([0.0]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bs=st.lists(_example, min_size=1, max_size=12), q=st.sampled_from([0.25, 0.5, 0.9, 1.0]),
       tau=st.sampled_from([0.0, 0.05, 0.1, 0.25, 1.0]), eps=st.sampled_from([1e-6, 0.3]))
def test_example_estimators_match_numpy(bs, q, tau, eps):
    rng = np.random.default_rng(0)
    rows = [make_row(f"k{i}", f"s{i % 2}.tar", b, t0=i % len(b), rng=rng) for i, b in enumerate(bs)]
    with tempfile.TemporaryDirectory() as d:
        write_store(Path(d), FP, rows)
        con = connect(d, params=EstimatorParams(q=q, tau=tau, eps=eps))
        got = {r[0]: r[1:] for r in con.sql(
            "SELECT key, degenerate, t0_share, t0_threshold, dilution, amplification, amplification_true, "
            "share_entropy, effective_tokens, max_share FROM examples").fetchall()}
    assert len(got) == len(rows)
    for row in rows:
        degenerate, t0s, t0t, dil, amp, amp_true, ent, eff, mx = got[row["key"]]
        T, want_t0s = row["T"], ref_t0_share(row, q, eps)
        assert degenerate == (row["b_sum"] < eps)
        assert t0s == want_t0s, row
        assert t0t == ref_t0_threshold(row, tau), row
        assert _close(dil, None if want_t0s is None else (want_t0s + 1) / T)
        assert _close(amp, None if want_t0s is None else T / (want_t0s + 1))
        assert _close(amp_true, T / (row["t0"] + 1))
        for g, w in zip((ent, eff, mx), ref_concentration(row, eps)):
            assert _close(g, w), (row, g, w)


def _reference_forms() -> dict[str, str]:
    """The list forms that estimators.sql documents as the definitions of the scalar-based macros."""
    forms = re.findall(r"^-- reference (\w+)\s+= (.+)$", read_sql("estimators"), flags=re.MULTILINE)
    return dict(forms)


def test_documented_list_forms_equal_the_stored_scalars(random_store):
    """share_entropy, effective_tokens and max_share read scalars written at extraction; their
    documented list forms, evaluated over b, give the same numbers."""
    root, rows = random_store
    forms = _reference_forms()
    assert set(forms) == {"share_entropy", "effective_tokens", "max_share"}
    columns = ", ".join(f"{name}, {form} AS {name}_list" for name, form in forms.items())
    got = connect(root).sql(f"SELECT {columns} FROM examples WHERE NOT degenerate").fetchall()
    assert len(got) == sum(r["b_sum"] >= EstimatorParams().eps for r in rows) > 0
    for row in got:
        for stored, listed in zip(row[::2], row[1::2]):
            assert math.isclose(stored, listed, rel_tol=1e-12, abs_tol=1e-12), row


def test_share_ties_reach_exactly_q():
    """cumsum exactly at q * sum b counts as reached (>=); T = 1 gives position 0."""
    rows = [make_row("tie", "s.tar", [0.5, 0.5, 0.5, 0.5]), make_row("one", "s.tar", [2.0]),
            make_row("zero", "s.tar", [0.0, 0.0])]
    with tempfile.TemporaryDirectory() as d:
        write_store(Path(d), FP, rows)
        con = connect(d, params=EstimatorParams(q=0.5, tau=0.5))
        got = dict(con.sql("SELECT key, [t0_share, t0_threshold] FROM examples").fetchall())
    assert got == {"tie": [1, None], "one": [0, 0], "zero": [None, None]}


# ---------------------------------------------------------------- aggregate queries


@pytest.fixture(scope="module")
def random_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("random_store")
    rows = example_rows(3, 400, max_T=10, shards=3)
    write_store(root, FP, rows)
    return root, rows


def _tokens(rows):
    for r in rows:
        for pos, b in enumerate(r["b"]):
            yield r, pos, float(b)


def test_profiles_match_numpy(random_store):
    root, rows = random_store
    con = connect(root)
    by_pos = {r["pos"]: r for r in con.sql(read_sql("profile_by_position")).to_arrow_table().to_pylist()}
    for pos in range(10):
        values = np.array([b for _, p, b in _tokens(rows) if p == pos])
        got = by_pos[pos]
        assert got["n"] == len(values)
        assert math.isclose(got["mean_b"], values.mean(), rel_tol=1e-9)
        for column, q in (("q10_b", 0.1), ("median_b", 0.5), ("q90_b", 0.9)):
            assert math.isclose(got[column], np.quantile(values, q), rel_tol=1e-6, abs_tol=1e-9)
    for name, key in (("profile_by_strategy", "strategy"), ("profile_by_T", "T")):
        for got in con.sql(read_sql(name)).to_arrow_table().to_pylist():
            values = np.array([b for r, p, b in _tokens(rows) if p == got["pos"] and r[key] == got[key]])
            assert got["n"] == len(values)
            assert math.isclose(got["mean_b"], values.mean(), rel_tol=1e-9)
            assert math.isclose(got["median_b"], np.median(values), rel_tol=1e-6, abs_tol=1e-9)


def test_summary_matches_numpy(random_store):
    root, rows = random_store
    params = EstimatorParams()
    (got,) = connect(root, params=params).sql(read_sql("summary")).to_arrow_table().to_pylist()
    pairs = [(ref_t0_share(r, params.q, params.eps), r["t0"]) for r in rows]
    pairs = [(e, t) for e, t in pairs if e is not None and t is not None]
    err = np.array([abs(e - t) for e, t in pairs])
    assert got["examples"] == len(rows) and got["tokens"] == sum(r["T"] for r in rows)
    assert got["degenerate"] == sum(r["b_sum"] < params.eps for r in rows) > 0
    assert got["t0_share_compared"] == len(pairs)
    assert math.isclose(got["t0_share_exact"], np.mean(err == 0))
    assert math.isclose(got["t0_share_mae"], err.mean())
    assert math.isclose(got["t0_share_within_1"], np.mean(err <= 1))
    assert got["t0_threshold_none"] == sum(ref_t0_threshold(r, params.tau) is None for r in rows)
    eff = [ref_concentration(r, params.eps)[1] / r["T"] for r in rows if r["b_sum"] >= params.eps]
    assert math.isclose(got["mean_effective_fraction"], np.mean(eff), rel_tol=1e-9)
    kept = [r for r in rows if r["b_sum"] >= params.eps]
    ratio = np.mean([(r["b"] ** 2).sum() / r["b"].sum() for r in kept]) / np.mean([r["b"].sum() / r["T"] for r in kept])
    assert math.isclose(got["gain_ratio_if_z_removes_b"], ratio, rel_tol=1e-6)


def test_tokens_view_symbols_and_shares(random_store):
    root, rows = random_store
    con = connect(root)
    row = rows[0]
    got = con.sql(f"SELECT pos, b, token_id, symbol, pi FROM tokens WHERE key = '{row['key']}' ORDER BY pos").fetchall()
    assert [g[0] for g in got] == list(range(row["T"]))
    assert [g[1] for g in got] == pytest.approx(row["b"].tolist())
    assert [g[3] for g in got] == [VOCAB[i] for i in row["target_id"]]
    assert [g[4] for g in got] == pytest.approx((row["b"] / row["b_sum"]).tolist())


# ---------------------------------------------------------------- what the views read


def test_only_manifest_listed_parts_are_read(tmp_path):
    rows = example_rows(1, 40, shards=2)
    directory = write_store(tmp_path, FP, rows)
    listed = sorted(p.name for p in directory.iterdir())
    # a stray valid part (another run's), a torn temporary part, and a truncated part-named file
    write_store(tmp_path / "other", FP, example_rows(2, 30, shards=1))
    (tmp_path / "other" / f"fingerprint={FP}" / "part-00000.parquet").rename(directory / "part-00007.parquet")
    (directory / "part-00001.parquet.tmp").write_bytes((directory / "part-00001.parquet").read_bytes()[:100])
    (directory / "part-00009.parquet").write_bytes(b"PAR1 torn")
    assert sorted(p.name for p in directory.iterdir()) != listed
    con = connect(tmp_path)
    assert con.sql("SELECT count(*) FROM examples").fetchall() == [(40,)]
    assert sorted(k for (k,) in con.sql("SELECT key FROM examples").fetchall()) == sorted(r["key"] for r in rows)


def test_a_damaged_listed_part_is_an_error_naming_it(tmp_path):
    directory = write_store(tmp_path, FP, example_rows(1, 20, shards=2))
    part = directory / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[:-10])
    with pytest.raises(ValueError, match="part-00001.parquet"):
        connect(tmp_path)


def test_fingerprints_side_by_side_as_text(tmp_path):
    digits = "0" * 31 + "7"  # all digits, leading zeros: must stay text
    write_store(tmp_path, FP, example_rows(1, 30))
    write_store(tmp_path, digits, example_rows(2, 12), fmt="zarr")
    con = connect(tmp_path)
    counts = dict(con.sql("SELECT fingerprint, count(*) FROM examples GROUP BY ALL").fetchall())
    assert counts == {FP: 30, digits: 12}
    assert con.sql("SELECT DISTINCT typeof(fingerprint) FROM tokens").fetchall() == [("VARCHAR",)]
    assert dict(con.sql("SELECT fingerprint, count(*) FROM vocab GROUP BY ALL").fetchall()) == {FP: 8, digits: 8}
    assert dict(con.sql("SELECT fingerprint, format FROM manifests").fetchall()) == {FP: "parquet", digits: "zarr"}
    only = connect(tmp_path, [digits])
    assert only.sql("SELECT DISTINCT fingerprint FROM examples").fetchall() == [(digits,)]


def test_zarr_and_parquet_give_the_same_examples(tmp_path):
    rows = example_rows(5, 60, shards=3)
    write_store(tmp_path / "p", FP, rows)
    write_store(tmp_path / "z", FP, rows, fmt="zarr")
    query = "SELECT * EXCLUDE (fingerprint) FROM examples ORDER BY key"
    assert connect(tmp_path / "p").sql(query).fetchall() == connect(tmp_path / "z").sql(query).fetchall()


def test_bad_parameters_are_refused():
    for kwargs in ({"q": 0.0}, {"q": 1.5}, {"tau": -1.0}, {"eps": 0.0}):
        with pytest.raises(ValueError):
            EstimatorParams(**kwargs)


def test_empty_store_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no fingerprint"):
        connect(tmp_path)


# ---------------------------------------------------------------- the views against today's plain definitions

# The `tokens` view as first written: every list unnested, symbols joined from `vocab`.
# The view now picks lists by position and looks symbols up in a map; it must give these rows.
REFERENCE_TOKENS = """
SELECT t.fingerprint, t.shard, t.key, t.T, t.strategy, t.t0, t.pos, t.b,
       t.token_id, v.token AS symbol, t.entropy, t.top1, t.cumsum_b,
       CASE WHEN is_degenerate(t.b_sum, getvariable('eps')) THEN NULL ELSE t.b / t.b_sum END AS pi
FROM (SELECT fingerprint, shard, key, T, strategy, t0, b_sum,
             unnest(range(T)) AS pos, unnest(b) AS b, unnest(target_id) AS token_id,
             unnest(entropy) AS entropy, unnest(top1) AS top1, unnest(cumsum_b) AS cumsum_b
      FROM store_rows) AS t
LEFT JOIN vocab AS v ON v.fingerprint = t.fingerprint AND v.id = t.token_id"""


def test_tokens_view_equals_the_unnest_and_join_definition(tmp_path):
    write_store(tmp_path, FP, example_rows(6, 80, shards=2))
    write_store(tmp_path, "0" * 32, example_rows(7, 30, shards=1), fmt="zarr")
    con = connect(tmp_path)
    order = " ORDER BY fingerprint, key, pos"
    got = con.sql("SELECT * EXCLUDE (in_quantile_sample) FROM tokens" + order).fetchall()
    assert got == con.sql(REFERENCE_TOKENS + order).fetchall()


def _plan(con, query: str) -> str:
    return "\n".join(row[1] for row in con.sql("EXPLAIN " + query).fetchall())


def test_a_query_over_b_reads_only_b(random_store):
    """No other list is read or unnested, and no join with vocab runs, for a query that names b only."""
    plan = _plan(connect(random_store[0]), "SELECT pos, avg(b) FROM tokens GROUP BY pos")
    for column in ("target_id", "entropy", "top1", "cumsum_b"):
        assert column not in plan, plan
    assert "JOIN" not in plan.upper(), plan


DIAGNOSTICS = ("SELECT avg(t0_share), avg(t0_threshold), avg(dilution), avg(share_entropy), avg(effective_tokens), "
               "avg(max_share) FROM examples")


def test_diagnostics_at_the_default_parameters_read_no_list(random_store):
    """At the stored q, tau and eps the t0 estimates are the stored columns; at others they come from the lists."""
    root = random_store[0]
    plan = _plan(connect(root), DIAGNOSTICS)
    for column in ("b", "cumsum_b", "target_id", "entropy", "top1"):
        assert not re.search(rf"\b{column}\b", plan), plan
    other = _plan(connect(root, params=EstimatorParams(q=0.5, tau=0.2)), DIAGNOSTICS)
    assert re.search(r"\bcumsum_b\b", other) and re.search(r"\bb\b", other), other
    con = connect(root)
    stored = con.sql("SELECT key, t0_share, t0_threshold FROM examples ORDER BY key").fetchall()
    con.execute("SET VARIABLE eps = 1e-6 + 1e-12")  # not the stored eps: computed from the lists, same values
    con.execute("SET VARIABLE tau = 0.1 + 1e-12")
    assert con.sql("SELECT key, t0_share, t0_threshold FROM examples ORDER BY key").fetchall() == stored


# The per-position profile as first written: three exact quantile aggregates over every token.
REFERENCE_PROFILE = """
SELECT fingerprint, pos, count(*) AS n, avg(b) AS mean_b,
       quantile_cont(b, 0.1) AS q10_b, quantile_cont(b, 0.5) AS median_b, quantile_cont(b, 0.9) AS q90_b,
       avg(pi) AS mean_pi
FROM tokens GROUP BY fingerprint, pos ORDER BY fingerprint, pos"""
QUANTILES = {"q10_b": 0.1, "median_b": 0.5, "q90_b": 0.9}


def _records(con, query: str) -> list[dict]:
    return con.sql(query).to_arrow_table().to_pylist()


def _assert_same_profile(got: list[dict], want: list[dict], quantiles_too: bool):
    """Counts and quantiles equal; means equal up to the order of DuckDB's parallel sums."""
    assert [(g["fingerprint"], g["pos"], g["n"]) for g in got] == [(w["fingerprint"], w["pos"], w["n"]) for w in want]
    for g, w in zip(got, want):
        for column in ("mean_b", "mean_pi"):
            assert math.isclose(g[column], w[column], rel_tol=1e-12), (g, w)
        if quantiles_too:
            assert [g[c] for c in QUANTILES] == [w[c] for c in QUANTILES], (g, w)
            assert g["n_quantile"] == g["n"]


@pytest.fixture(scope="module")
def continuous_store(tmp_path_factory):
    """About 16k tokens of nearly continuous surprisals (few ties), for the quantile sample."""
    root = tmp_path_factory.mktemp("continuous_store")
    values = np.random.default_rng(9).exponential(1.0, 5000).astype(np.float32)
    write_store(root, FP, example_rows(8, 3000, max_T=10, shards=3, values=values))
    return root


@pytest.mark.parametrize("quantile_tokens", [None, 10**6])
def test_exact_profile_equals_the_reference(continuous_store, quantile_tokens):
    """No limit, or a store below the limit: the profile is today's exact query, value for value."""
    con = connect(continuous_store, quantile_tokens=quantile_tokens)
    assert con.sql("SELECT getvariable('quantile_share')").fetchall() == [(1.0,)]
    _assert_same_profile(_records(con, read_sql("profile_by_position")), _records(con, REFERENCE_PROFILE), True)


def test_exact_profile_of_fingerprints_side_by_side(tmp_path):
    write_store(tmp_path, FP, example_rows(10, 200, max_T=7))
    write_store(tmp_path, "0" * 32, example_rows(11, 150, max_T=9), fmt="zarr")
    con = connect(tmp_path)
    got = _records(con, read_sql("profile_by_position"))
    assert {g["fingerprint"] for g in got} == {FP, "0" * 32}
    _assert_same_profile(got, _records(con, REFERENCE_PROFILE), True)


def test_sampled_profile_quantiles_are_those_of_the_sample_within_the_documented_error(continuous_store):
    con = connect(continuous_store, quantile_tokens=4000)
    got, want = _records(con, read_sql("profile_by_position")), _records(con, REFERENCE_PROFILE)
    _assert_same_profile(got, want, quantiles_too=False)  # counts and means still read every token
    tokens = con.sql("SELECT pos, b, in_quantile_sample FROM tokens").fetchnumpy()
    sampled = tokens["in_quantile_sample"]
    assert 3000 < sampled.sum() < 5000  # about quantile_tokens tokens
    for row in got:
        at = tokens["pos"] == row["pos"]
        mine, every = tokens["b"][at & sampled].astype(np.float64), np.sort(tokens["b"][at].astype(np.float64))
        assert row["n_quantile"] == len(mine)
        for column, p in QUANTILES.items():
            # the exact quantile of the sampled examples' values ...
            assert math.isclose(row[column], np.quantile(mine, p), rel_tol=1e-6), (row, column)
            # ... whose rank among all values (an interval: every tenth row is all zero) is within
            # the documented 2 sigma of p (4 here: 30 checks)
            ranks = np.searchsorted(every, row[column], side="left"), np.searchsorted(every, row[column], side="right")
            low, high = (r / len(every) for r in ranks)
            off = max(low - p, p - high, 0.0)
            assert off <= 4 * math.sqrt(p * (1 - p) / len(mine)), (row, column, low, high)


def test_quantile_sample_is_whole_examples_and_deterministic(continuous_store):
    query = "SELECT key, bool_and(in_quantile_sample), bool_or(in_quantile_sample) FROM tokens GROUP BY key"
    first = sorted(connect(continuous_store, quantile_tokens=4000).sql(query).fetchall())
    assert all(every == some for _, every, some in first)
    assert first == sorted(connect(continuous_store, quantile_tokens=4000).sql(query).fetchall())
