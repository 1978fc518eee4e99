"""`tokweight inspect`: the report files, the summary against SQL, ground truth from --data, the tiny pipeline."""

from __future__ import annotations

import json
import math

import numpy as np
from click.testing import CliRunner

from tokweight.cli import main
from tokweight.pipeline.data.samples import Sample
from tokweight.pipeline.data.shards import write_shards
from tokweight.report.inspect_config import InspectConfig
from tokweight.report.inspect import run
from tests.support.fixtures_sql import example_rows, make_row, write_store

FP = "e" * 32
PLOTS = ("profile.png", "t0_confusion.png", "amplification.png", "concentration.png")


def _check_report(out):
    report = (out / "report.md").read_text()
    for plot in PLOTS:
        assert (out / plot).stat().st_size > 1000, plot
        assert f"]({plot})" in report
    for heading in ("## Definitions", "## Surprisal profile by position", "## t0 estimates against the ground truth",
                    "## Dilution and predicted amplification", "## Weight concentration"):
        assert heading in report
    return report, json.loads((out / "summary.json").read_text())


def test_report_files_and_summary(tmp_path):
    rows = example_rows(7, 200, max_T=9)
    write_store(tmp_path / "store", FP, rows)
    run(InspectConfig(store=str(tmp_path / "store"), out=str(tmp_path / "report"), q=0.8))
    report, summary = _check_report(tmp_path / "report")
    (fp,) = summary["fingerprints"]
    assert fp["fingerprint"] == FP and fp["examples"] == 200 and fp["complete"] is True
    assert summary["params"] == {"q": 0.8, "tau": 0.1, "eps": 1e-6}
    truth = [(np.nonzero(r["cumsum_b"] >= 0.8 * r["b_sum"])[0][0], r["t0"]) for r in rows
             if r["t0"] is not None and r["b_sum"] >= 1e-6]
    assert math.isclose(fp["t0_share_exact"], np.mean([e == t for e, t in truth]))
    assert f"{fp['t0_share_exact']:.1%}" in report
    assert json.loads((tmp_path / "report" / "config.json").read_text())["q"] == 0.8
    header = (tmp_path / "report" / "profile_by_position.csv").read_text().splitlines()[0]
    assert header.startswith("fingerprint,pos,n,mean_b")


def test_data_fills_in_missing_ground_truth(tmp_path):
    """Rows stored without strategy/t0 get them from the dataset, its shards matched by content."""
    rng = np.random.default_rng(0)
    samples = [Sample(key=f"s{i}", x=("a",), y=("b",) * int(rng.integers(1, 6)), strategy="copy", t0=i % 2)
               for i in range(12)]
    paths = write_shards(samples, tmp_path / "data" / "train", shard_size=5)
    names = [f"moved/elsewhere-{i}.tar" for i in range(len(paths))]  # the store knows other names
    rows = [make_row(s.key, names[i // 5], rng.random(len(s.y) + 1), rng=rng) for i, s in enumerate(samples)]
    write_store(tmp_path / "store", FP, rows, input_files=dict(zip(names, paths)))

    without = run(InspectConfig(store=str(tmp_path / "store"), out=str(tmp_path / "r0")))
    assert without["fingerprints"][0]["with_true_t0"] == 0
    assert without["fingerprints"][0]["t0_share_exact"] is None
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "store"), "--out", str(tmp_path / "r1"),
                                       "--data", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert "report.md" in result.output
    fp = json.loads((tmp_path / "r1" / "summary.json").read_text())["fingerprints"][0]
    assert fp["with_true_t0"] == 12
    assert isinstance(fp["t0_share_exact"], float)


def test_inspect_bad_store_is_a_clean_error(tmp_path):
    result = CliRunner().invoke(main, ["inspect", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "no fingerprint" in result.output and "Traceback" not in result.output


def test_inspect_on_the_tiny_pipeline(tiny_pipeline, tmp_path):  # noqa: F811
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["inspect", str(tiny_pipeline["store"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    _, summary = _check_report(out)
    (fp,) = summary["fingerprints"]
    assert fp["examples"] > 0 and fp["with_true_t0"] == fp["examples"]
    assert isinstance(fp["t0_share_exact"], float) and 0.0 <= fp["t0_share_exact"] <= 1.0
    assert isinstance(fp["t0_share_mae"], float)


def test_predicted_beta_c_against_hand_computation(tmp_path):
    """gain / H(strategy) per weighting; a degenerate example's surprisal-share gain is its uniform one."""
    rows = [make_row("a", "train/shard-000000.tar", [1.0, 0.0, 0.0], strategy="copy"),
            make_row("b", "train/shard-000000.tar", [0.5, 0.5], strategy="copy"),
            make_row("c", "train/shard-000000.tar", [0.0, 0.0], strategy="sort"),  # degenerate
            make_row("d", "train/shard-000000.tar", [2.0, 0.0, 0.0, 0.0], strategy="sort")]
    write_store(tmp_path / "store", FP, rows)
    summary = run(InspectConfig(store=str(tmp_path / "store"), out=str(tmp_path / "report")))
    got = {r["weighting"]: r for r in summary["predicted_beta_c"]}
    gains = {"uniform": (1 / 3 + 1 / 2 + 0 + 2 / 4) / 4, "sum": (1 + 1 + 0 + 2) / 4,
             "surprisal-share": (1 + 0.5 + 0 + 2) / 4}  # sum b^2 / sum b: 1, 0.5, (uniform) 0, 2
    for name, gain in gains.items():
        assert math.isclose(got[name]["gain_nats"], gain, rel_tol=1e-6)
        assert math.isclose(got[name]["kl_cost_nats"], math.log(2), rel_tol=1e-9)
        assert math.isclose(got[name]["beta_c_predicted"], gain / math.log(2), rel_tol=1e-6)
    assert "## Collapse threshold beta_c predicted from the store" in (tmp_path / "report" / "report.md").read_text()


def test_predicted_beta_c_without_labels_has_no_cost(tmp_path):
    write_store(tmp_path / "store", FP, [make_row("a", "train/shard-000000.tar", [1.0, 0.5])])
    summary = run(InspectConfig(store=str(tmp_path / "store"), out=str(tmp_path / "report")))
    assert all(r["kl_cost_nats"] is None and r["beta_c_predicted"] is None for r in summary["predicted_beta_c"])
    assert math.isclose(summary["predicted_beta_c"][1]["gain_nats"], 1.5, rel_tol=1e-6)


def test_exact_quantiles_reach_the_profile(tmp_path, monkeypatch):
    """Above the sample size the profile reads a sample of examples (n_quantile < n); --exact-quantiles reads all."""
    import csv

    import tokweight.store.inspection

    write_store(tmp_path / "store", FP, example_rows(3, 200, max_T=9))
    monkeypatch.setattr(tokweight.store.inspection, "QUANTILE_TOKENS", 200)  # the store holds ~1000 tokens
    counts = {}
    for exact in (False, True):
        out = tmp_path / f"report-{exact}"
        args = ["inspect", str(tmp_path / "store"), "--out", str(out)] + (["--exact-quantiles"] if exact else [])
        assert CliRunner().invoke(main, args).exit_code == 0
        rows = list(csv.DictReader((out / "profile_by_position.csv").open()))
        counts[exact] = [(int(r["n"]), int(r["n_quantile"])) for r in rows]
    assert all(q == n for n, q in counts[True])
    assert sum(q for _, q in counts[False]) < sum(n for n, _ in counts[False])
