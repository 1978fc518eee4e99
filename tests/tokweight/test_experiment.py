"""`tokweight experiment` on the tiny task: the --quick path end to end, reuse, recipes, keys."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from tokweight.store.lock import StoreLock, StoreLockedError
from tokweight.experiments import artefacts, cells, grid as exp
from tokweight.experiments.artefacts import Setting, TaskConfig, synth_config, synthetic_task
from tokweight.pipeline.data.synth import config_dict
from tokweight.experiments.grid import plot_amplification
from tokweight.config_files import preset_names
from tokweight.experiments.recipes import recipe_overrides, with_recipe
from tests.support.fixtures_experiment import TINY_BUDGET, TINY_TASK


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def finite(text: str) -> bool:
    return text != "" and math.isfinite(float(text))


def quick_cfg(root: Path) -> exp.ExperimentConfig:
    # the plain objective: the posterior-gradient amplification is measured on it (an E-step optimises no recon)
    return replace(exp.quick(exp.ExperimentConfig(out=str(root), task=TINY_TASK, recipe="baseline")), budget=TINY_BUDGET)


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
    assert expected == 2 * 3 * 2 + 3 * 2  # settings x weightings x betas, + token/prefix/layernorm x betas
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


def test_a_cell_another_job_is_training_is_waited_for_then_reused(quick_run, monkeypatch):
    """Two jobs on one root: the second finds the cell's run locked, waits (its waiting message is the fault
    hook: there the first job finishes and lets go), then reuses its record instead of training it again."""
    root, first, _ = quick_run
    cfg = quick_cfg(root)
    cell = exp.experiment_cells(cfg)[0]
    prep = artefacts.prepare_all(cfg.task, root, lambda line: None, (cell.setting,))[cell.setting]
    run_dir = root / "runs" / first["cells"][0]["run"]
    record = (run_dir / "cell.json").read_text()
    other_job = StoreLock(run_dir)
    other_job.acquire()
    (run_dir / "cell.json").unlink()  # still training
    monkeypatch.setattr(cells, "LOCK_WAIT_S", 0.0)
    with pytest.raises(StoreLockedError, match=run_dir.name):
        cells.run_cell(cell, prep, cfg.plan, root)
    told = []

    def other_job_finishes(message: str) -> None:
        told.append(message)
        (run_dir / "cell.json").write_text(record)
        other_job.release()

    monkeypatch.setattr(cells, "LOCK_WAIT_S", math.inf)
    monkeypatch.setattr(cells, "tell_waiting", other_job_finishes)
    done, reused = cells.run_cell(cell, prep, cfg.plan, root)
    assert reused and done == json.loads(record) and len(told) == 1 and "waiting" in told[0]


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
    prep = artefacts.Prepared(TINY_TASK.settings[0], tmp_path / "d", "k", tmp_path / "b", "fp", tmp_path / "s",
                              {"ratio_true": 1.0, "ratio_inspect": 1.0})
    cell = cells.Cell("h0", "discrete", "prefix", "surprisal-share", 0.3, 4)
    plain = cells.train_config(cell, prep, cells.CellPlan(2, 3, TINY_BUDGET, "default"), tmp_path / "run")
    for name in preset_names("recipes"):
        cfg = cells.train_config(cell, prep, cells.CellPlan(2, 3, TINY_BUDGET, name), tmp_path / "run")
        assert cfg == with_recipe(plain, name)  # the recipe check's path, not a second one
        assert (cfg.optim.lr, cfg.optim.steps, cfg.optim.batch_size) == \
            (TINY_BUDGET.lr, TINY_BUDGET.steps, TINY_BUDGET.batch_size)
        assert (cfg.loss.beta, cfg.cvae.cond, cfg.cvae.k, cfg.cvae.slots, cfg.loss.weighting, cfg.optim.seed) == \
            (0.3, "prefix", 2, 3, "surprisal-share", 4)
    survival = cells.train_config(cell, prep, cells.CellPlan(2, 3, TINY_BUDGET, "survival"), tmp_path / "run")
    assert survival.estep.mode == "label" and survival.cvae.posterior_pool == "mean"
    with pytest.raises(ValueError, match="no recipes preset"):
        cells.train_config(cell, prep, cells.CellPlan(2, 3, TINY_BUDGET, "nope"), tmp_path / "run")


def test_recipe_names():
    assert preset_names("recipes") == ["baseline", "default", "survival"] and recipe_overrides("default") == {}
    with pytest.raises(ValueError, match="no recipes preset 'nope'"):
        recipe_overrides("nope")


def test_cell_key_follows_the_config_not_the_paths(tmp_path):
    prep = artefacts.Prepared(TINY_TASK.settings[0], tmp_path / "d", "k", tmp_path / "b", "fp", tmp_path / "s", {})
    cell = cells.Cell("h0", "discrete", "token", "uniform", 1.0, 0)
    key = lambda c, p=prep, budget=TINY_BUDGET: cells.cell_key(  # noqa: E731
        cells.train_config(c, p, cells.CellPlan(2, 2, budget, "baseline"), tmp_path / "r"), p, budget.decode_examples)
    moved = replace(prep, data=tmp_path / "elsewhere", base=tmp_path / "b2")
    assert key(cell) == key(cell, moved)
    assert len({key(cell), key(replace(cell, beta=0.3)), key(replace(cell, seed=1)),
                key(cell, replace(prep, fingerprint="other")), key(cell, budget=replace(TINY_BUDGET, steps=4)),
                key(cell, budget=replace(TINY_BUDGET, decode_examples=9))}) == 6


def test_a_cell_key_covers_every_train_config_field_but_the_paths():
    """A key found again means the same cell: it hashes every resolved TrainConfig field with its value (a field
    added later moves every key, which is what a new default should do), the base fingerprint, the data and the
    evaluation; the paths and the trackers it reports to are left out, so a moved directory keeps its cells."""
    from dataclasses import fields

    from tokweight.training.config.train import GROUPS

    prep = artefacts.Prepared(synthetic_task().settings[0], Path("/d"), "datakey", Path("/b"), "fp123", Path("/s"), {})
    cell = cells.Cell("h0", "discrete", "prefix", "surprisal-share", 0.3, 4)
    plan = cells.CellPlan(4, 3, cells.CellBudget(), "default")
    tcfg = cells.train_config(cell, prep, plan, Path("/r"))
    spec = cells.cell_spec(tcfg, prep, 8)
    assert set(spec) == {"train", "base_fingerprint", "data", "eval"}
    for name, group in GROUPS.items():
        expected = {f.name for f in fields(group)} - (set(cells.PATH_FIELDS) if name == "io" else set()) - (
            {"report_to"} if name == "log" else set())
        assert set(spec["train"][name]) == expected, name
    key = cells.cell_key(tcfg, prep, 8)
    moved = replace(tcfg, io=replace(tcfg.io, checkpoint="/x", data="/y", store="/z", out="/w"))
    assert cells.cell_key(moved, replace(prep, data=Path("/y"), base=Path("/x")), 8) == key
    assert cells.cell_key(replace(tcfg, log=replace(tcfg.log, report_to=("tensorboard",))), prep, 8) == key
    changed = [replace(tcfg, loss=replace(tcfg.loss, anchor_weight=0.5)),
               replace(tcfg, cvae=replace(tcfg.cvae, latent_init_norm=2.0)),
               replace(tcfg, cvae=replace(tcfg.cvae, posterior_pool="last")),
               replace(tcfg, optim=replace(tcfg.optim, lr=1e-3)), replace(tcfg, io=replace(tcfg.io, lanes=2))]
    keys = {cells.cell_key(c, prep, 8) for c in changed} | {cells.cell_key(tcfg, replace(prep, fingerprint="x"), 8),
                                                           cells.cell_key(tcfg, replace(prep, data_key="x"), 8),
                                                           cells.cell_key(tcfg, prep, 9), key}
    assert len(keys) == 9


def test_data_and_base_keys_cover_their_configs():
    task = synthetic_task()
    s = task.settings[0]
    data_key = artefacts.key_of(json.loads(json.dumps(asdict(synth_config(task, s)))))
    other_data = artefacts.key_of(json.loads(json.dumps(asdict(synth_config(replace(task, synth=replace(
        task.synth, n_train=7)), s)))))
    assert data_key != other_data
    assert artefacts.base_key(task, data_key) != artefacts.base_key(task, other_data)
    assert artefacts.base_key(task, data_key) != artefacts.base_key(replace(task, base=replace(task.base, steps=7)),
                                                                     data_key)
    assert TaskConfig(**json.loads(json.dumps(asdict(TINY_TASK)))) == TINY_TASK  # read back from a config file


def test_data_key_is_the_shards_content(tmp_path):
    """A base is keyed by the bytes it trained on: data regenerated under a config that records one more field
    (as SynthConfig does when it gains one) keeps its key, and one changed shard byte changes it."""
    setting = TINY_TASK.settings[0]
    path, key, info, reused = artefacts.prepare_data(TINY_TASK, setting, tmp_path)
    assert not reused and info["config"] == json.loads(json.dumps(config_dict(synth_config(TINY_TASK, setting))))
    assert artefacts.prepare_data(TINY_TASK, setting, tmp_path)[1:] == (key, info, True)
    dataset = path / "dataset.json"
    dataset.write_text(json.dumps({**info, "config": {**info["config"], "field_of_before": 0}}))
    again_path, again_key, _, again_reused = artefacts.prepare_data(TINY_TASK, setting, tmp_path)
    assert (again_path, again_key, again_reused) == (path, key, False)
    shards = {split: sorted((path / split).glob("*.tar")) for split in ("test", "train", "val")}
    assert artefacts.data_key(path, shards) == key
    data = bytearray(shards["train"][0].read_bytes())
    data[-1] ^= 1
    shards["train"][0].write_bytes(bytes(data))
    assert artefacts.data_key(path, shards) != key


def test_config_validation():
    with pytest.raises(ValueError, match="unknown weightings"):
        exp.ExperimentConfig(out="x", weightings=("uniform", "bogus"))
    with pytest.raises(ValueError, match="distinct names"):
        TaskConfig(settings=(Setting("a", 0, 1, 2), Setting("a", 1, 1, 2)))
    with pytest.raises(ValueError, match="min_len"):
        Setting("a", 0, 3, 2)
    with pytest.raises(ValueError, match="k_max"):
        replace(synthetic_task(), base=replace(synthetic_task().base, k_max=1))


def test_amplification_plot_skips_ratios_a_log_axis_cannot_show():
    amp = [{"setting": "a", "ratio_true": 2.0, "measured_mean": 0.0, "measured_std": 0.0},
           {"setting": "b", "ratio_true": 8.0, "measured_mean": 6.5, "measured_std": 0.1},
           {"setting": "c", "ratio_true": 16.0, "measured_mean": None, "measured_std": None}]
    fig = plot_amplification(amp, "em-balanced")
    (ax,) = fig.axes
    assert ax.get_yscale() == "log" and len(ax.texts) == 1  # one annotated point: setting b
    fig = plot_amplification(amp[:1], "em-balanced")
    fig.savefig(io.BytesIO(), format="png")  # nothing positive: no log axis to fail on



def test_a_base_that_has_not_learnt_the_z_template_is_flagged():
    assert artefacts.zcond_gap({"base_val_nll": 0.238, "base_val_nll_zcond": 3.188}) > artefacts.ZCOND_TOLERANCE
    assert artefacts.zcond_gap({"base_val_nll": 0.121, "base_val_nll_zcond": 0.121}) < artefacts.ZCOND_TOLERANCE
    assert artefacts.zcond_gap({"base_val_nll": 0.121}) is None  # a base trained before the figure existed
