"""`tokweight experiment`: the end-to-end grid, or with --sweep beta the collapse-threshold sweep; with
--checkpoint and --data, the same comparison on the user's own task (tokweight.experiments.own_task)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from tokweight.pipeline.data_option import DataSource
from tokweight.pipeline.threads import set_threads, threads_option


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(v) for v in text.split(","))


def _floats(text: str | None) -> tuple[float, ...] | None:
    return None if text is None else tuple(float(v) for v in text.split(","))


@click.command("experiment")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Results directory; data, base models, stores and cells in it are reused when their keys match.")
@click.option("--quick", is_flag=True, help="Smaller grid: one seed, fewer cells (sweep: the largest T/(t0+1)).")
@click.option("--sweep", type=click.Choice(["beta"]), default=None, help="Measure the collapse threshold beta_c.")
@click.option("--recipe", default=None,
              help="experiments.recipes.RECIPES entry applied to every cell (default: baseline; sweep: survival).")
@click.option("--settings", default=None, help="Sweep: comma-separated setting names (default: all; quick: the last).")
@click.option("--seeds", default=None, help="Comma-separated seeds (default: 0,1,2; sweep 0,1; quick 0).")
@click.option("--betas", default=None, help="Comma-separated betas (default: 1,0.3; sweep: 8 log-spaced 0.01..10).")
@click.option("--cvae-steps", type=int, default=None, help="Steps per cell (default 300; experiment --quick 150).")
@click.option("--base-steps", type=int, default=None, help="Base-model steps per setting (default 3000).")
@click.option("--refine", type=int, default=0, help="Sweep: bisection steps per seed around beta_c.")
@click.option("--jobs", type=int, default=None,
              help="Cells trained at once, one process and torch thread each (default: 1; sweep: min(2, CPUs)).")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), default=None,
              help="Your own task: the entangled checkpoint (tokweight or Hugging Face); needs --data.")
@click.option("--data", type=DataSource(), default=None,
              help="Your own task: the dataset, with train/val/test splits (tokweight convert).")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Your own task: the store to extract into and read (default: OUT/store).")
@click.option("--template", default=None,
              help="Your own task: the checkpoint's format, as extract's --template (chat, or a string template "
                   "file; default: tokweight's).")
@click.option("--k", type=int, default=None, help="Your own task: latent values (default: the data's labels).")
@click.option("--cond", default=None, help="Your own task: z pathway (default: own_task.DEFAULT_COND).")
@click.option("--slots", type=int, default=None, help="Your own task: prefix slots (default: own_task.DEFAULT_SLOTS).")
@threads_option
def experiment(out, quick, sweep, recipe, settings, seeds, betas, cvae_steps, base_steps, refine, jobs, threads, **own):
    """Reproduce posterior collapse and its fix: data per T/(t0+1), base models, stores, a CVAE grid, results.
    With --checkpoint and --data: the weightings compared on your own task and checkpoint."""
    from tokweight.experiments.artefacts import TaskConfig, base_model

    set_threads(threads)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    chosen = {} if recipe is None else {"recipe": recipe}
    try:
        if own["checkpoint"] is not None or own["data"] is not None:
            if (settings, base_steps, refine) != (None, None, 0):
                raise ValueError("--settings, --base-steps and --refine are for the synthetic settings, not for "
                                 "--checkpoint/--data")
            cfg, run = own_job(out, quick, sweep, own, chosen)
        else:
            task = TaskConfig() if base_steps is None else TaskConfig(base=base_model(base_steps))
            cfg, run = job(out, quick, sweep, settings, refine, task, chosen)
        run(with_flags(cfg, seeds, betas, jobs, cvae_steps), echo=click.echo, command=command)
    except ValueError as e:
        raise click.ClickException(str(e)) from e


def own_job(out, quick, sweep, own: dict, chosen: dict):
    """(config, its run) of the user-task comparison, before the flags every job takes."""
    from tokweight.experiments import own_task

    if own["checkpoint"] is None or own["data"] is None:
        raise ValueError("your own task needs both --checkpoint CKPT and --data DATA")
    given = {k: v for k, v in own.items() if v is not None}
    cfg = own_task.OwnTaskConfig(out=out, **given, **chosen)
    cfg = own_task.sweep_betas(cfg) if sweep == "beta" else cfg
    return (own_task.quick(cfg) if quick else cfg), own_task.run


def job(out, quick, sweep, settings, refine, task, chosen: dict):
    """(config, its run) of the sweep or of the grid, before the flags both take."""
    from tokweight.experiments import grid
    from tokweight.experiments import sweep as sw

    if sweep == "beta":
        cfg = sw.SweepConfig(out=out, task=task, refine=refine, **chosen)
        cfg = sw.quick_sweep(cfg) if quick else cfg
        return (cfg if settings is None else replace(cfg, settings=tuple(settings.split(",")))), sw.run
    if settings is not None:
        raise ValueError("--settings applies to --sweep beta only")
    cfg = grid.ExperimentConfig(out=out, task=task, **chosen)
    return (grid.quick(cfg) if quick else cfg), grid.run


def with_flags(cfg, seeds: str | None, betas: str | None, jobs: int | None, cvae_steps: int | None):
    """``cfg`` with the seeds, betas, jobs and steps per cell that were given."""
    given = {"seeds": _ints(seeds), "betas": _floats(betas), "jobs": jobs}
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    return cfg if cvae_steps is None else replace(cfg, budget=replace(cfg.budget, steps=cvae_steps))
