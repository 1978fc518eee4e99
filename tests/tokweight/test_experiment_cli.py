"""`tokweight experiment --help` reads its defaults and --quick's budget from the job configs and the preset
files, so it cannot drift from what a run does."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from tokweight import config_files
from tokweight.cli import main
from tokweight.config_files import preset
from tokweight.experiments import grid, own_task
from tokweight.experiments import sweep as sw


def help_text() -> str:
    """The help as one line (click wraps it)."""
    result = CliRunner().invoke(main, ["experiment", "--help"], terminal_width=400, max_content_width=400)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_the_help_shows_each_jobs_defaults_and_the_quick_budget():
    text = help_text()
    cfgs = {"grid": grid.ExperimentConfig(out="o"), "sweep": sw.SweepConfig(out="o"),
            "own task": own_task.OwnTaskConfig(checkpoint="c", data="d", out="o")}
    assert ", ".join(f"{job} {c.recipe}" for job, c in cfgs.items()) == "grid default, sweep survival, own task default"
    assert "(default: grid default, sweep survival, own task default)" in text  # not "baseline"
    steps = [c.budget.steps for c in cfgs.values()]
    assert steps == [6000, 1000, 6000]  # train's cap, not 300
    assert "Cap on the steps of each cell (default: grid 6000, sweep 1000, own task 6000; --quick: grid 150" in text
    quick = own_task.quick(cfgs["own task"])
    cells, cap = len(own_task.own_cells(quick)), preset("experiment", "own-quick")["budget"]["steps"]
    assert cells == 6 and quick.budget.steps == cap  # 3 weightings x 2 betas x one seed
    assert f"own task: 6 cells x up to {cap} steps x 1 start;" in text
    assert f"grid: {len(grid.experiment_cells(grid.quick(cfgs['grid'])))} cells x up to 150 steps x 1 start" in text
    assert "own task: 18 cells x up to 6000 steps x 3 starts" in text  # without --quick
    assert "z pathway (default: query, train's)" in text and "prefix slots (default: 4, train's)" in text


def test_the_quick_help_follows_the_preset_file(tmp_path, monkeypatch):
    presets = tmp_path / "presets"
    shutil.copytree(config_files.PRESETS, presets)
    path = presets / "experiment" / "own-quick.toml"
    path.write_text(path.read_text().replace(f"steps = {preset('experiment', 'own-quick')['budget']['steps']}",
                                             "steps = 777"))
    monkeypatch.setattr(config_files, "PRESETS", presets)
    assert "own task: 6 cells x up to 777 steps x 1 start;" in help_text()


def test_config_and_set_reach_the_jobs_fields_in_order(tmp_path):
    """--config FILE over the job's defaults and --quick's, the job's options over it, --set over them all; a field
    the job does not have is one line naming it, before anything runs."""
    from tokweight.config_files import assignment
    from tokweight.commands.experiment import job, made_by, over, with_flags
    from tokweight.experiments.artefacts import synthetic_task

    cfg, _ = job(str(tmp_path / "o"), True, "beta", None, None, synthetic_task(), {})
    filed = over(cfg, {"out": "elsewhere", "refine": 2, "budget.steps": 40, "seeds": [5]})
    cfg = over(filed, made_by(str(tmp_path / "o"), {}, None, None, None, {}))  # the options that made the job
    cfg = over(with_flags(cfg, "6", None, None, None), dict([assignment("budget.steps=30")]))
    assert (cfg.out, cfg.refine, cfg.seeds, cfg.budget.steps) == (str(tmp_path / "o"), 2, (6,), 30)
    refused = CliRunner().invoke(main, ["experiment", "--out", str(tmp_path / "r"), "--set", "budget.stepz=3"])
    assert refused.exit_code == 1 and "budget.stepz: no such field" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
