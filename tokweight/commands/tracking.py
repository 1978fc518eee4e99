"""What the commands report to the trackers a run names (``--report-to``, ``training/loop/trackers.py``) beyond the metrics
the training loop feeds them: the run's figures at its end (``report.run_plots``) and, where a command evaluates
(an experiment's cells), eval's verdict, its table and its figure. Rank 0 alone reports (torchrun's ``RANK``)."""

from __future__ import annotations

import os
from pathlib import Path

from tokweight.training.loop.trackers import Trackers


def main_rank() -> bool:
    """Whether this process reports: rank 0 of a torchrun job, or a process of its own."""
    return int(os.environ.get("RANK", "0")) == 0


def train_reported(cfg) -> dict:
    """``training.loop.train.run(cfg)`` with its trackers opened here, so that the run's figures go to them at the end."""
    from tokweight.training.loop.train import run, run_trackers

    trackers = run_trackers(cfg, main_rank())
    try:
        result = run(cfg, trackers=trackers)
        log_run_figures(trackers, cfg.io.out)
        return result
    finally:
        trackers.close()


def log_run_figures(trackers: Trackers, run: str | Path) -> None:
    """The run's figures (``run_plots.run_figures``), as images at its last step."""
    if not trackers:
        return
    from tokweight.report.run_plots import run_figures

    for name, fig in run_figures(run).items():
        trackers.log_figure(f"figures/{name.removesuffix('.png')}", fig)


def log_eval(trackers: Trackers, evaluated: dict) -> None:
    """eval's verdict (text and ``eval/z_used``), its numbers as ``eval/<name>``, eval.md as text and the figure of
    the strategies each latent value's decodes execute, at the step of the checkpoint eval read."""
    if not trackers:
        return
    from tokweight.report.eval_md import eval_markdown
    from tokweight.report.run_plots import plot_strategies
    from tokweight.training.loop.trackers import series

    verdict, step = evaluated["z_used"], evaluated["step"]
    values = series({"split": "eval", **evaluated["metrics"]})
    trackers.log_metrics(step, values | {"eval/z_used": float(bool(verdict.get("used")))})
    trackers.log_text("eval/verdict", f"**{verdict['outcome']}**: {verdict['statement']}", step)
    trackers.log_text("eval/table", eval_markdown(evaluated["metrics"], evaluated["decode"], verdict), step)
    trackers.log_figure("figures/strategies", plot_strategies(evaluated), step)

