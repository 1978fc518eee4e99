"""`tokweight experiment` on the tiny task: the --quick path end to end, reuse, recipes, keys."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import replace
from pathlib import Path

import pytest

from training import experiment as exp
from tests.fixtures_experiment import TINY_BUDGET, TINY_TASK


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def finite(text: str) -> bool:
    return text != "" and math.isfinite(float(text))


def quick_cfg(root: Path) -> exp.ExperimentConfig:
    return replace(exp.quick(exp.ExperimentConfig(out=str(root), task=TINY_TASK)), budget=TINY_BUDGET)


@pytest.fixture(scope="module")
def quick_run(experiment_root):  # noqa: F811
    lines: list[str] = []
    result = exp.run(quick_cfg(experiment_root), echo=lines.append, command="test")
    return experiment_root, result, lines


def test_quick_writes_every_file_with_finite_numbers_per_cell(quick_run):
    root, result, lines = quick_run
    for name in ("results.md", "results.csv", "cells.csv", "settings.csv", "amplification.csv",
                 "experiment_config.json"):
        assert (root / name).stat().st_size > 0, name
    for name in ("mi_vs_ratio.png", "amplification.png"):
        assert (root / name).read_bytes()[:4] == b"\x89PNG"
    cfg = quick_cfg(root)
    expected = len(exp.experiment_cells(cfg))
    assert expected == 2 * 3 * 2 + 2 * 2  # settings x weightings x betas, + prefix/layernorm x betas
    cells = read_csv(root / "cells.csv")
    assert len(cells) == expected and sum(f"[cell {i}/{expected}]" in "\n".join(lines) for i in (1, expected)) == 2
    for row in cells:
        assert row["seed"] == "0" and row["recipe"] == "baseline"
        for metric in ("mi", "kl", "strategy_nmi", "control_accuracy", "recon_uniform", "recon", "grad_recon_init"):
            assert finite(row[metric]), (row["setting"], row["weighting"], metric, row[metric])
        assert 0 <= float(row["mi"]) <= math.log(2) + 1e-6
    results = read_csv(root / "results.csv")
    assert len(results) == expected  # one seed: one aggregated row per cell
    for row in results:
        assert row["n_seeds"] == "1" and row["recipe"] == "baseline"
        assert all(finite(row[f"{m}_{s}"]) for m in ("mi", "kl", "control_accuracy") for s in ("mean", "std"))
    settings = read_csv(root / "settings.csv")
    assert [s["setting"] for s in settings] == ["h0", "h2"]
    assert float(settings[1]["ratio_true"]) < float(settings[0]["ratio_true"])  # a header lowers T/(t0+1)
    assert all(finite(s["ratio_inspect"]) and finite(s["base_b_after_t0"]) for s in settings)
    amp = read_csv(root / "amplification.csv")
    assert [a["pairs"] for a in amp] == ["2", "2"] and all(finite(a["measured_mean"]) for a in amp)
    md = (root / "results.md").read_text()
    assert "recipe: `baseline`" in md and "## Gradient amplification" in md and "layernorm" in md


def test_rerun_reuses_every_artefact_and_gives_the_same_table(quick_run):
    root, first, _ = quick_run
    lines: list[str] = []
    again = exp.run(quick_cfg(root), echo=lines.append)
    assert all(r["reused"] for r in again["cells"])
    assert sum("reused: data, base, store" in line for line in lines) == 2
    assert [r["mi_mean"] for r in again["results"]] == [r["mi_mean"] for r in first["results"]]


def test_continuous_and_every_weighting_give_finite_numbers(experiment_root):  # noqa: F811
    task = replace(TINY_TASK, settings=TINY_TASK.settings[:1])
    cfg = exp.ExperimentConfig(out=str(experiment_root), task=task, betas=(0.3,), seeds=(0, 1), cond_modes=(),
                               budget=TINY_BUDGET)
    result = exp.run(cfg, echo=lambda line: None)
    rows = {(r["group"], r["weighting"]): r for r in result["results"]}
    assert len(rows) == len(exp.ALL_WEIGHTINGS) + 2
    for (group, w), r in rows.items():
        assert r["n_seeds"] == 2 and r["seeds"] == "0;1"
        metrics = ("kl", "strategy_nmi", "control_accuracy", "recon_uniform")
        metrics += ("active_units",) if group == "continuous" else ("mi",)
        assert all(math.isfinite(r[f"{m}_mean"]) and math.isfinite(r[f"{m}_std"]) for m in metrics), (group, w)
        assert (r["mi_mean"] is None) == (group == "continuous")


def test_recipe_overrides_how_to_train_but_not_what_is_compared(tmp_path):
    prep = exp.Prepared(TINY_TASK.settings[0], tmp_path / "d", "k", tmp_path / "b", "fp", tmp_path / "s",
                        {"ratio_true": 1.0, "ratio_inspect": 1.0})
    cell = exp.Cell("h0", "discrete", "prefix", "surprisal-share", 0.3, 4)
    recipe = {"lr": 5e-4, "beta": {"kind": "linear", "warmup_steps": 2, "beta": 9.0},
              "cvae": {"cond": "token", "k": 7}, "weighting": "uniform"}
    cfg = exp.train_config(cell, prep, 2, 3, TINY_BUDGET, recipe, tmp_path / "run")
    assert cfg.lr == 5e-4 and cfg.beta.kind == "linear" and cfg.beta.warmup_steps == 2
    assert (cfg.beta.beta, cfg.cvae.cond, cfg.cvae.k, cfg.cvae.slots, cfg.weighting, cfg.seed) == \
        (0.3, "prefix", 2, 3, "surprisal-share", 4)
    with pytest.raises(ValueError, match="recipe overrides"):
        exp.train_config(cell, prep, 2, 3, TINY_BUDGET, {"no_such_field": 1}, tmp_path / "run")


def test_recipe_names():
    assert exp.load_recipe("baseline") == {} or "baseline" in __import__("training.recipes").recipes.RECIPES
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        exp.load_recipe("nope")


def test_cell_key_follows_the_config_not_the_paths(tmp_path):
    prep = exp.Prepared(TINY_TASK.settings[0], tmp_path / "d", "k", tmp_path / "b", "fp", tmp_path / "s", {})
    cell = exp.Cell("h0", "discrete", "token", "uniform", 1.0, 0)
    key = lambda c, p=prep, budget=TINY_BUDGET: exp.cell_key(  # noqa: E731
        exp.train_config(c, p, 2, 2, budget, {}, tmp_path / "r"), p, budget.decode_examples)
    moved = replace(prep, data=tmp_path / "elsewhere", base=tmp_path / "b2")
    assert key(cell) == key(cell, moved)
    assert len({key(cell), key(replace(cell, beta=0.3)), key(replace(cell, seed=1)),
                key(cell, replace(prep, fingerprint="other")), key(cell, budget=replace(TINY_BUDGET, steps=4)),
                key(cell, budget=replace(TINY_BUDGET, decode_examples=9))}) == 6


def test_config_validation():
    with pytest.raises(ValueError, match="unknown weightings"):
        exp.ExperimentConfig(out="x", weightings=("uniform", "bogus"))
    with pytest.raises(ValueError, match="distinct names"):
        exp.TaskConfig(settings=(exp.Setting("a", 0, 1, 2), exp.Setting("a", 1, 1, 2)))
    with pytest.raises(ValueError, match="min_len"):
        exp.Setting("a", 0, 3, 2)


def test_amplification_plot_skips_ratios_a_log_axis_cannot_show():
    from training.experiment import plot_amplification

    amp = [{"setting": "a", "ratio_true": 2.0, "measured_mean": 0.0, "measured_std": 0.0},
           {"setting": "b", "ratio_true": 8.0, "measured_mean": 6.5, "measured_std": 0.1},
           {"setting": "c", "ratio_true": 16.0, "measured_mean": None, "measured_std": None}]
    fig = plot_amplification(amp, "em-balanced")
    (ax,) = fig.axes
    assert ax.get_yscale() == "log" and len(ax.texts) == 1  # one annotated point: setting b
    fig = plot_amplification(amp[:1], "em-balanced")
    fig.savefig(io.BytesIO(), format="png")  # nothing positive: no log axis to fail on
