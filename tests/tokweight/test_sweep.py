"""The beta sweep: beta_c as defined (hand-made MI tables, bisection), and the quick path on the tiny task."""

from __future__ import annotations

import csv
import math
from dataclasses import replace

import pytest

from tokweight.experiments import results, sweep as sw
from tests.support.fixtures_experiment import TINY_BUDGET, TINY_TASK

HALF_LOG2 = 0.5 * math.log(2)


def test_beta_c_is_the_largest_beta_that_kept_z():
    assert results.beta_c({0.01: 0.69, 0.1: 0.40, 1.0: 0.01, 10.0: 0.0}, HALF_LOG2) == 0.1
    assert results.beta_c({0.01: 0.1, 0.1: 0.5, 1.0: 0.0}, HALF_LOG2) == 0.1  # not monotone: still the largest
    assert results.beta_c({0.01: 0.69, 0.1: 0.69, 1.0: 0.69}, HALF_LOG2) == 1.0
    assert results.beta_c({0.01: HALF_LOG2, 1.0: 0.0}, HALF_LOG2) == 0.01  # at the threshold counts as kept
    assert results.beta_c({0.01: None, 0.1: 0.5}, HALF_LOG2) == 0.1


def test_no_beta_kept_z_is_none_never_zero():
    assert results.beta_c({0.01: 0.2, 0.1: 0.0, 1.0: 0.0}, HALF_LOG2) is None
    assert results.beta_c({}, HALF_LOG2) is None
    assert results.show(None) == results.NO_BETA != "0"
    assert results.show(0.1) == "0.1"


def test_bracket_and_bisection():
    grid = (0.01, 0.1, 1.0, 10.0)
    assert results.bracket(grid, 0.1) == (0.1, 1.0)
    assert results.bracket(grid, 10.0) is None and results.bracket(grid, None) is None
    true_c, span = 0.37, (0.1, 1.0)
    for _ in range(6):
        mid = results.midpoint(span)
        span = results.narrow(span, mid, 0.69 if mid <= true_c else 0.0, HALF_LOG2)
    assert span[0] <= true_c < span[1] and span[1] / span[0] < (1.0 / 0.1) ** (1 / 2 ** 6) * 1.001
    assert results.midpoint((0.1, 10.0)) == 1.0 and results.narrow((0.1, 10.0), 1.0, HALF_LOG2, HALF_LOG2) == (1.0, 10.0)


def test_gain_estimate_reads_the_grid_ends():
    cells = [{"beta": 0.01, "mi": 0.69, "recon": 0.1, "kl": 0.7}, {"beta": 0.01, "mi": 0.69, "recon": 0.3, "kl": 0.6},
             {"beta": 1.0, "mi": 0.68, "recon": 0.5, "kl": 0.7}, {"beta": 10.0, "mi": 0.0, "recon": 1.6, "kl": 0.0}]
    got = sw.gain_estimate(cells, (0.01, 1.0, 10.0), HALF_LOG2)
    assert got["z_gain_nats"] == pytest.approx(1.4) and got["kl_with_z"] == pytest.approx(0.65)
    assert got["beta_c_from_gain"] == pytest.approx(1.4 / 0.65)
    never_collapsed = [dict(c, mi=0.69) for c in cells]
    assert sw.gain_estimate(never_collapsed, (0.01, 1.0, 10.0), HALF_LOG2)["beta_c_from_gain"] is None


def test_prediction_columns_compare_every_seed_with_the_store():
    cfg = sw.SweepConfig(out="x", task=TINY_TASK, betas=(0.1, 1.0, 10.0), seeds=(0, 1))
    cells = [{"beta": b, "seed": s, "strategy_mi": mi, "mi": 0.69} for s, curve in ((0, (0.69, 0.69, 0.0)),
                                                                                 (1, (0.69, 0.0, 0.0)))
             for b, mi in zip(cfg.betas, curve)]  # by I(z; strategy), beta_c: 1.0 (seed 0), 0.1 (seed 1)
    got = sw.prediction_columns(0.8, cells, cfg)
    assert got["beta_c_predicted"] == 0.8 and got["measured_over_predicted"] == "0:1.25;1:0.12"
    assert got["within_tolerance"] == "no"  # seed 1 is 8x below
    assert sw.prediction_columns(0.8, [c for c in cells if c["seed"] == 0], replace(cfg, seeds=(0,)))[
        "within_tolerance"] == "yes"
    assert sw.prediction_columns(None, cells, cfg)["within_tolerance"] is None


def test_ratio_rows_cover_every_case():
    def rows(ss, uni):
        return [{"recipe": "baseline", "setting": "a", "ratio_true": 8.0, "ratio_inspect": 7.5, "weighting": w,
                 "beta_c": b, "beta_c_strategy_mi": results.NO_BETA} for w, b in (("surprisal-share", ss), ("uniform", uni))]

    grid = (0.01, 10.0)
    both = sw.ratio_rows(rows("0.8", "0.1"), grid)[0]
    assert both["measured_ratio"] == "8" and both["measured_ratio_strategy_mi"].startswith("undefined")
    assert sw.ratio_rows(rows("0.8", results.NO_BETA), grid)[0]["measured_ratio"].startswith("> 80")
    assert sw.ratio_rows(rows(results.NO_BETA, "0.1"), grid)[0]["measured_ratio"].startswith("< 0.1")
    assert sw.ratio_rows(rows(results.NO_BETA, results.NO_BETA), grid)[0]["measured_ratio"].startswith("undefined")


def test_config_validation():
    with pytest.raises(ValueError, match="unknown settings"):
        sw.SweepConfig(out="x", task=TINY_TASK, settings=("nope",))
    with pytest.raises(ValueError, match="distinct values > 0"):
        sw.SweepConfig(out="x", task=TINY_TASK, betas=(0.0, 1.0))
    assert sw.SweepConfig(out="x", betas=(1.0, 0.1)).betas == (0.1, 1.0)
    assert len(results.log_grid(0.01, 10, 8)) == 8 and results.log_grid(0.01, 10, 8)[-1] == 10.0


def test_quick_sweep_files_and_beta_c_as_defined(experiment_root):  # noqa: F811
    cfg = replace(sw.quick_sweep(sw.SweepConfig(out=str(experiment_root / "sweep"), task=TINY_TASK)),
                  weightings=("uniform", "surprisal-share"), betas=(0.1, 1.0, 10.0), budget=TINY_BUDGET,
                  jobs=2)  # the process pool; cells are seeded, so no number depends on it
    assert cfg.settings == ("h2",) and cfg.seeds == (0,)
    result = sw.run(cfg, echo=lambda line: None)
    root = experiment_root / "sweep"
    for name in ("beta_threshold.md", "beta_threshold.csv", "beta_ratio.csv", "beta_cells.csv"):
        assert (root / name).stat().st_size > 0
    for name in ("mi_vs_beta.png", "mi_vs_step.png"):
        assert (root / name).read_bytes()[:4] == b"\x89PNG"
    with (root / "beta_cells.csv").open() as f:
        cells = list(csv.DictReader(f))
    assert len(cells) == 2 * 3 and all(c["seed"] == "0" and math.isfinite(float(c["mi"])) for c in cells)
    with (root / "beta_threshold.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert [s["weighting"] for s in summary] == ["uniform", "surprisal-share"]
    for s in summary:
        for metric, column in (("mi", "beta_c"), ("strategy_mi", "beta_c_strategy_mi")):
            mi = {float(c["beta"]): float(c[metric]) for c in cells if c["weighting"] == s["weighting"]}
            expected = results.beta_c(mi, HALF_LOG2)
            assert s[column] == results.show(expected) and s[column] != "0"
            if metric == "mi":
                assert (s["kept_z"] == "yes") == (expected is not None)
        assert s["recipe"] == "survival"
    assert all(float(c["strategy_mi"]) <= float(c["mi"]) + 1e-9 for c in cells)  # s is a function of the example
    assert "no beta in the grid kept z" in (root / "beta_threshold.md").read_text() or \
        all(s["kept_z"] == "yes" for s in summary)
    assert len(result["ratios"]) == 1 and result["ratios"][0]["measured_ratio"]


def test_cli_settings_are_checked_before_any_work(tmp_path):
    from click.testing import CliRunner

    from tokweight.commands.experiment import experiment

    out = ["--out", str(tmp_path / "x")]
    wrong = CliRunner().invoke(experiment, out + ["--settings", "h0-n16"])
    assert wrong.exit_code != 0 and "--settings applies to --sweep beta only" in wrong.output
    unknown = CliRunner().invoke(experiment, out + ["--sweep", "beta", "--settings", "h9-n99"])
    assert unknown.exit_code != 0 and "unknown settings ['h9-n99']" in unknown.output
    assert not (tmp_path / "x").exists()
    assert sw.SweepConfig(out="x").recipe == "survival"
