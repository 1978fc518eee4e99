"""Which latent values to trust: eval's per-value report and `tokweight sql --run`'s latent_values view tell a value
that names one strategy from a merge (two strategies chosen per input), which reconstructs as well."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokweight.store.sql import add_posteriors
from tokweight.training.evaluation.verdict import ONE_STRATEGY, value_report


def test_a_value_whose_decodes_execute_two_strategies_is_a_merge():
    executes = {"0": {"copy": 0.97, "reverse": 0.01, "none": 0.02},  # a strategy code
                "1": {"copy": 0.45, "reverse": 0.5, "none": 0.05},  # the merge: copy or reverse by input
                "2": {"copy": 0.02, "reverse": 0.03, "none": 0.95}}  # executes nothing
    clusters, strategies = [0, 0, 1, 1, 2], ["copy", "copy", "copy", "reverse", None]
    report = value_report(clusters, strategies, executes, 3)
    status = {v: r["status"] for v, r in report["values"].items()}
    assert status == {"0": "one strategy", "1": "merge", "2": "unreliable"} and report["trusted"] == [0]
    assert report["values"]["1"]["strategy"] == "reverse" and report["values"]["1"]["share"] == 0.5
    assert report["values"]["1"]["labels"] == {"copy": 0.5, "reverse": 0.5} and report["values"]["1"]["examples"] == 2


def test_without_decodes_the_labels_the_posterior_picks_decide_and_without_either_nothing_is_claimed():
    clusters = [0] * 10 + [1] * 10 + [2] * 3
    strategies = ["a"] * 10 + ["a"] * 6 + ["b"] * 4 + [None] * 3
    report = value_report(clusters, strategies, None, 4)
    status = {v: r["status"] for v, r in report["values"].items()}
    assert status == {"0": "one strategy", "1": "merge", "2": "unknown", "3": "unknown"}
    assert report["values"]["3"]["examples"] == 0 and report["values"]["0"]["decodes"] is None


def test_the_sql_view_gives_each_values_labels_and_status(tmp_path):
    rows = [("k0", 0, "a"), ("k1", 0, "a"), ("k2", 0, "a"), ("k3", 1, "a"), ("k4", 1, "b"), ("k5", 1, None),
            ("k6", 2, None)]
    table = pa.table({"key": [r[0] for r in rows], "split": ["test"] * len(rows),
                      "strategy": pa.array([r[2] for r in rows], pa.string()),
                      "latent": pa.array([r[1] for r in rows], pa.int32())})
    pq.write_table(table, tmp_path / "posteriors-test.parquet")
    con = duckdb.connect()
    add_posteriors(con, tmp_path, ONE_STRATEGY)
    got = con.execute("SELECT latent, examples, labelled, strategy, share, status, labels FROM latent_values").fetchall()
    assert [g[:6] for g in got] == [(0, 3, 3, "a", 1.0, "one strategy"), (1, 3, 2, "a", 0.5, "merge"),
                                    (2, 1, 0, None, None, "no labels")]
    assert got[1][6] == [{"strategy": "a", "share": 0.5}, {"strategy": "b", "share": 0.5}]


def test_eval_writes_the_report_into_eval_json_and_eval_md(tiny, tiny_store, tmp_path):
    from tokweight.report.eval_md import write_eval_md
    from tokweight.training.config.use import EvalConfig
    from tokweight.training.evaluation.evaluate import run_eval
    from tokweight.training.loop.train import run as train
    from tokweight.training.config.train import IOConfig, OptimConfig, TrainConfig

    data, ckpt = tiny
    run = tmp_path / "run"
    train(TrainConfig(IOConfig(checkpoint=str(ckpt), data=str(data), out=str(run), store=str(tiny_store),
                               num_workers=0, device="cpu"), optim=OptimConfig(steps=2, batch_size=8, starts=1)))
    evaluated = run_eval(EvalConfig(run=str(run), data=str(data), decode_examples=16, device="cpu"))
    report = json.loads((run / "eval.json").read_text())["values"]
    assert set(report["values"]) == {"0", "1", "2", "3"} and report["one_strategy"] == ONE_STRATEGY
    assert all(r["decodes"] is not None for r in report["values"].values())  # the tiny task is synthetic
    assert sum(r["examples"] for r in report["values"].values()) == evaluated["metrics"]["examples"]
    md = write_eval_md(run, evaluated).read_text()
    assert "## Which latent values to trust" in md and ("values naming one strategy" in md
                                                         or "no value names one strategy" in md)
    with pytest.raises(KeyError):
        report["values"]["4"]
