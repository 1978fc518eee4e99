"""`tokweight experiment`: the end-to-end grid, or with --sweep beta the collapse-threshold sweep; with
--checkpoint and --data, the same comparison on the user's own task (tokweight.experiments.own_task).

Every default is the job config's (experiments.grid.ExperimentConfig, experiments.sweep.SweepConfig,
experiments.own_task.OwnTaskConfig) and --quick's is a preset file (tokweight/presets/experiment/*-quick.toml).
The help of an option that shows one reads it from there when the help is shown (``JobHelp``), so it cannot
drift from what a run does.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import click

from tokweight.config_files import assignment, flat, read
from tokweight.pipeline.data.data_option import DataSource
from tokweight.pipeline.models.dtypes import TRAIN_DTYPES
from tokweight.pipeline.threads import set_threads, threads_option


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(int(v) for v in text.split(","))


def _floats(text: str | None) -> tuple[float, ...] | None:
    return None if text is None else tuple(float(v) for v in text.split(","))


# ---------------------------------------------------------------- help from the job configs


class JobHelp(click.Option):
    """An option whose help is computed when it is shown, from the job configs (which the command's import does
    not load)."""

    def __init__(self, *args, help_of: Callable[[], str], **kwargs):
        super().__init__(*args, **kwargs)
        self.help_of = help_of

    def get_help_record(self, ctx):
        self.help = self.help_of()
        return super().get_help_record(ctx)


def job_configs(quick: bool) -> dict:
    """{job: its config as the command builds it with no other option}: "grid", "sweep", "own task"."""
    from tokweight.experiments import grid, own_task
    from tokweight.experiments import sweep as sw

    configs = {"grid": grid.ExperimentConfig(out="OUT"), "sweep": sw.SweepConfig(out="OUT"),
               "own task": own_task.OwnTaskConfig(checkpoint="CKPT", data="DATA", out="OUT")}
    if quick:
        configs = {"grid": grid.quick(configs["grid"]), "sweep": sw.quick_sweep(configs["sweep"]),
                   "own task": own_task.quick(configs["own task"])}
    return configs


def shown(value) -> str:
    """A default as an option takes it: a tuple comma-separated, a float without trailing zeros."""
    if isinstance(value, tuple):
        return ",".join(shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def per_job(of: Callable) -> str:
    """"default: grid A, sweep B, own task C[; --quick: ...]" of ``of(config)``; --quick's part where it differs."""
    def line(configs: dict) -> str:
        return ", ".join(f"{job} {shown(of(cfg))}" for job, cfg in configs.items())

    full, fast = line(job_configs(False)), line(job_configs(True))
    return f"default: {full}" + ("" if fast == full else f"; --quick: {fast}")


def cell_count(job: str, cfg) -> int:
    """The cells ``job`` runs under ``cfg`` (the sweep: before any bisection step)."""
    from tokweight.experiments import grid, own_task
    from tokweight.experiments import sweep as sw

    cells = {"grid": grid.experiment_cells, "sweep": sw.grid_cells, "own task": own_task.own_cells}[job]
    return len(cells(cfg))


def budgets(quick: bool) -> str:
    """Each job's cells x steps x starts."""
    from tokweight.experiments.cells import budget_line

    return "; ".join(f"{job}: {budget_line(cell_count(job, cfg), cfg.budget)}"
                     for job, cfg in job_configs(quick).items())


def quick_help() -> str:
    return (f"Fewer and shorter cells ({budgets(True)}; the sweep on the largest T/(t0+1) only). Without it: "
            f"{budgets(False)}.")


def recipe_help() -> str:
    from tokweight.config_files import preset_names

    return (f"A recipe of tokweight/presets/recipes/ ({', '.join(preset_names('recipes'))}) applied to every "
            f"cell ({per_job(lambda c: c.recipe)}).")


def settings_help() -> str:
    full, fast = (job_configs(quick)["sweep"].setting_names for quick in (False, True))
    return f"Sweep: comma-separated setting names (default: all of {shown(full)}; --quick: {shown(fast)})."


def base_steps_help() -> str:
    from tokweight.experiments.artefacts import synthetic_task

    return f"Base-model steps per setting (default: {synthetic_task().base.steps})."


def own_help(text: str, field: str) -> Callable[[], str]:
    """``text`` and the own task's default of ``field``."""
    def help_of() -> str:
        from tokweight.experiments.own_task import OwnTaskConfig
        from tokweight.commands.flags import default_of

        return f"Your own task: {text} (default: {shown(default_of(OwnTaskConfig, field))}, train's)."

    return help_of


# ---------------------------------------------------------------- the command


@click.command("experiment")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Results directory; data, base models, stores and cells in it are reused when their keys match.")
@click.option("--quick", is_flag=True, cls=JobHelp, help_of=quick_help)
@click.option("--sweep", type=click.Choice(["beta"]), default=None, help="Measure the collapse threshold beta_c.")
@click.option("--recipe", default=None, cls=JobHelp, help_of=recipe_help)
@click.option("--settings", default=None, cls=JobHelp, help_of=settings_help)
@click.option("--seeds", default=None, cls=JobHelp,
              help_of=lambda: f"Comma-separated seeds ({per_job(lambda c: c.seeds)}).")
@click.option("--betas", default=None, cls=JobHelp,
              help_of=lambda: f"Comma-separated betas ({per_job(lambda c: c.betas)}; own task with --sweep beta: the "
                              "sweep's).")
@click.option("--cvae-steps", type=int, default=None, cls=JobHelp,
              help_of=lambda: f"Cap on the steps of each cell ({per_job(lambda c: c.budget.steps)}).")
@click.option("--base-steps", type=int, default=None, cls=JobHelp, help_of=base_steps_help)
@click.option("--refine", type=int, default=None, cls=JobHelp,
              help_of=lambda: f"Sweep: bisection steps per seed around beta_c (default: "
                              f"{shown(job_configs(False)['sweep'].refine)}).")
@click.option("--jobs", type=int, default=None, cls=JobHelp,
              help_of=lambda: f"Cells trained at once, one process and torch thread each "
                              f"({per_job(lambda c: c.jobs)}; the sweep's: min(2, CPUs)).")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False), default=None,
              help="Your own task: the entangled checkpoint (built-in or Hugging Face); needs --data.")
@click.option("--data", type=DataSource(), default=None,
              help="Your own task: the dataset, with train/val/test splits (tokweight convert).")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Your own task: the store to extract into and read (default: OUT/store).")
@click.option("--template", default=None,
              help="Your own task: the checkpoint's format, as extract's --template (chat, or a string template "
                   "file; default: tokweight's).")
@click.option("--k", type=int, default=None, help="Your own task: latent values (default: the data's labels).")
@click.option("--cond", default=None, cls=JobHelp, help_of=own_help("z pathway", "cond"))
@click.option("--slots", type=int, default=None, cls=JobHelp, help_of=own_help("prefix slots", "slots"))
@click.option("--dtype", type=click.Choice(TRAIN_DTYPES), default=None,
              help="The forward's dtype in every cell's training and eval.  [default: auto, bfloat16 on CUDA, float32 "
                   "elsewhere]")
@click.option("--report-to", "report_to", default=None,
              help="Trackers each cell trained reports to, comma-separated: tensorboard, mlflow, wandb (offline, in the "
                   "cell's run directory; each needs pip install 'tokweight[NAME]').  [default: none]")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A configuration file (TOML or JSON) of the job's fields (ExperimentConfig, SweepConfig or "
                   "OwnTaskConfig): the defaults and --quick's it changes. Flags and --set override it.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Set any field of the job's config, e.g. --set budget.batch_size=16 (repeatable; the value a TOML "
                   "literal).")
@threads_option
def experiment(out, quick, sweep, recipe, settings, seeds, betas, cvae_steps, base_steps, refine, jobs, threads, dtype,
               report_to, config, sets, **own):
    """Reproduce posterior collapse and its fix: data per T/(t0+1), base models, stores, a CVAE grid, results.
    With --checkpoint and --data: the weightings compared on your own task and checkpoint."""
    from tokweight.experiments.artefacts import base_schedule, synthetic_task

    set_threads(threads)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    chosen = {} if recipe is None else {"recipe": recipe}
    try:
        if own["checkpoint"] is not None or own["data"] is not None:
            if (settings, base_steps, refine) != (None, None, None):
                raise ValueError("--settings, --base-steps and --refine are for the synthetic settings, not for "
                                 "--checkpoint/--data")
            cfg, run = own_job(out, quick, sweep, own, chosen)
        else:
            task = synthetic_task()
            if base_steps is not None:
                task = replace(task, base=replace(task.base, **base_schedule(base_steps)))
            cfg, run = job(out, quick, sweep, settings, refine, task, chosen)
        if config:  # the file over the defaults and --quick's, the options that made the job over it again
            cfg = over(cfg, flat(read(config)) | made_by(out, chosen, refine, settings, base_steps, own))
        cfg = with_flags(cfg, seeds, betas, jobs, cvae_steps, dtype, report_to)
        run(over(cfg, dict(assignment(item) for item in sets)), echo=click.echo, command=command)
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
        cfg = sw.SweepConfig(out=out, task=task, **chosen, **({} if refine is None else {"refine": refine}))
        cfg = sw.quick_sweep(cfg) if quick else cfg
        return (cfg if settings is None else replace(cfg, settings=tuple(settings.split(",")))), sw.run
    if settings is not None:
        raise ValueError("--settings applies to --sweep beta only")
    cfg = grid.ExperimentConfig(out=out, task=task, **chosen)
    return (grid.quick(cfg) if quick else cfg), grid.run


def over(cfg, values: dict):
    """``cfg`` with dotted fields set (a nested group field by field); a field it does not have is refused by its
    dotted name."""
    from tokweight.config_files import build, plain, with_values

    return build(type(cfg), with_values(plain(cfg), values)) if values else cfg


def made_by(out, chosen: dict, refine, settings, base_steps, own: dict) -> dict:
    """The dotted fields the options that make a job set (before the flags every job takes)."""
    from tokweight.experiments.artefacts import base_schedule

    made = {"out": out, **chosen, **{k: v for k, v in own.items() if v is not None}}
    made |= {} if refine is None else {"refine": refine}
    made |= {} if settings is None else {"settings": settings.split(",")}
    return made | ({} if base_steps is None else {f"task.base.{k}": v for k, v in base_schedule(base_steps).items()})


def with_flags(cfg, seeds: str | None, betas: str | None, jobs: int | None, cvae_steps: int | None,
               dtype: str | None = None, report_to: str | None = None):
    """``cfg`` with the seeds, betas, jobs, steps per cell, dtype and trackers that were given."""
    from tokweight.training.config.components import parse_report_to

    given = {"seeds": _ints(seeds), "betas": _floats(betas), "jobs": jobs}
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    budget = {k: v for k, v in {"steps": cvae_steps, "dtype": dtype,
                                "report_to": None if report_to is None else parse_report_to(report_to)}.items()
              if v is not None}
    return replace(cfg, budget=replace(cfg.budget, **budget)) if budget else cfg
