"""`tokweight experiment`: posterior collapse and its fix, end to end, as one table.

Per T/(t0+1) setting (the generator's header and length knobs): synthetic data -> the
entangled base model -> its baseline store, each built once (training.experiments.artefacts);
then a grid of CVAE cells (weighting x beta x seed with a discrete latent of K = #strategies;
the continuous latent for uniform vs surprisal-share; surprisal-share under each z pathway at
the largest T/(t0+1)), each trained and evaluated on the test split with decode-per-latent.

Outputs in DIR: cells.csv (one row per cell and seed), results.csv and results.md (mean
± std over seeds), mi_vs_ratio.png, amplification.png, experiment_config.json.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tokweight.report.plots import save_figures
from tokweight.training.configs import COND_MODES, WEIGHTINGS, CVAEConfig
from tokweight.training.experiments.aggregate import aggregate, mean_std
from tokweight.training.experiments.artefacts import Echo, prepare_all
from tokweight.training.experiments.cells import Cell, CellBudget, CellPlan, run_cells
from tokweight.training.experiments.grid_report import plot_amplification, plot_mi_vs_ratio, render_results
from tokweight.training.experiments.report import write_config, write_csv
from tokweight.training.experiments.task import TaskConfig, coerce_nested
from tokweight.training.experiments.recipes import recipe_overrides

ALL_WEIGHTINGS = tuple(WEIGHTINGS)


@dataclass(frozen=True)
class ExperimentConfig:
    """The grid of `tokweight experiment` (QUICK shrinks it)."""

    out: str
    """Results directory; data/, base/, store/ and runs/ below it are reused across runs."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Data and base models."""
    weightings: tuple[str, ...] = ALL_WEIGHTINGS
    """Weightings of the discrete grid."""
    betas: tuple[float, ...] = (1.0, 0.3)
    """KL weights (RESEARCH-NOTES: below ~gain/I the weightings' optima differ; 1 can collapse all)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of every cell (heads, data order, noise)."""
    continuous_weightings: tuple[str, ...] = ("uniform", "surprisal-share")
    """Weightings of the continuous-latent cells (empty: none)."""
    cond_modes: tuple[str, ...] = COND_MODES
    """z pathways for surprisal-share at the largest setting (``cond`` is the grid's own)."""
    cond: str = CVAEConfig.cond
    """z pathway of the discrete grid's cells (train's by default)."""
    prefix_slots: int | None = None
    """Latent slots of the prefix pathway (None: train's)."""
    budget: CellBudget = field(default_factory=CellBudget)
    """Steps and evaluation size per cell."""
    recipe: str = "default"
    """Name in experiments.recipes.RECIPES whose remedies every cell trains with; "default": train's."""
    jobs: int = 1
    """Cells trained at once, each in its own process with one torch thread (no effect on any number)."""

    def __post_init__(self):
        coerce_nested(self, task=TaskConfig, budget=CellBudget)
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")
        for name in ("weightings", "betas", "seeds", "continuous_weightings", "cond_modes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        bad = [w for w in self.weightings + self.continuous_weightings if w not in ALL_WEIGHTINGS]
        bad += [c for c in self.cond_modes + (self.cond,) if c not in COND_MODES]
        if bad:
            raise ValueError(f"unknown weightings or z pathways: {bad}")
        if not self.weightings or not self.betas or not self.seeds:
            raise ValueError("weightings, betas and seeds must be non-empty")
        if any(not b >= 0 for b in self.betas) or (self.prefix_slots or 1) < 1:
            raise ValueError("betas must be >= 0 and prefix_slots >= 1")

    @property
    def plan(self) -> CellPlan:
        return CellPlan(self.task.k, self.prefix_slots, self.budget, self.recipe)


QUICK = dict(weightings=("uniform", "sum", "surprisal-share"), seeds=(0,), continuous_weightings=(),
             budget=CellBudget(steps=150))
"""--quick: one seed, three weightings, no continuous cells, half the steps; same data and base models."""


def quick(cfg: ExperimentConfig) -> ExperimentConfig:
    return replace(cfg, **QUICK)


def experiment_cells(cfg: ExperimentConfig) -> list[Cell]:
    names = [s.name for s in cfg.task.settings]
    cells = [Cell(s, "discrete", cfg.cond, w, b, seed) for s in names for w in cfg.weightings
             for b in cfg.betas for seed in cfg.seeds]
    cells += [Cell(s, "continuous", cfg.cond, w, b, seed, "continuous") for s in names
              for w in cfg.continuous_weightings for b in cfg.betas for seed in cfg.seeds]
    cells += [Cell(names[-1], "discrete", c, "surprisal-share", b, seed, "cond") for c in cfg.cond_modes
              if c != cfg.cond for b in cfg.betas for seed in cfg.seeds]
    return cells


def amplification(rows: list[dict], settings: dict[str, dict]) -> list[dict]:
    """Measured surprisal-share / uniform posterior-gradient norm at step 0 per setting, over the
    (beta, seed) pairs of discrete token cells (same seed: same heads and first batch), against
    the predicted T/(t0+1)."""
    ratios = gradient_ratios(rows, settings)
    out = []
    for name, stats in settings.items():
        mean, std = mean_std(ratios[name])
        out.append({"setting": name, "ratio_true": stats["ratio_true"], "ratio_inspect": stats["ratio_inspect"],
                    "effective_tokens": stats["effective_tokens"], "measured_mean": mean, "measured_std": std,
                    "pairs": len(ratios[name])})
    return out


def gradient_ratios(rows: list[dict], settings: dict[str, dict]) -> dict[str, list[float]]:
    """setting -> grad_recon_init(surprisal-share) / grad_recon_init(uniform), one per (beta, seed) pair."""
    grid = {(r["setting"], r["beta"], r["seed"], r["weighting"]): r for r in rows if r["group"] == "grid"}
    ratios: dict[str, list[float]] = {name: [] for name in settings}
    for (s, b, seed, w), uniform in grid.items():
        share = grid.get((s, b, seed, "surprisal-share"))
        if w == "uniform" and share and uniform["grad_recon_init"] and share["grad_recon_init"] is not None:
            ratios.setdefault(s, []).append(share["grad_recon_init"] / uniform["grad_recon_init"])
    return ratios


def run(cfg: ExperimentConfig, echo: Echo = print, command: str | None = None) -> dict:
    """Build or reuse every artefact, run every cell, write the results; returns the paths and tables."""
    start = time.perf_counter()
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    write_config(root / "experiment_config.json", cfg, recipe_overrides(cfg.recipe))  # an unknown recipe: no work
    cells = experiment_cells(cfg)
    echo(f"[experiment] {len(cfg.task.settings)} settings, {len(cells)} cells of {cfg.budget.steps} steps, "
         f"recipe {cfg.recipe}")
    prepared = prepare_all(cfg.task, root, echo)
    rows = run_cells(cells, prepared, cfg.plan, root, echo, cfg.jobs)
    settings = {name: p.stats for name, p in prepared.items()}
    agg, amp = aggregate(rows), amplification(rows, settings)
    wall = time.perf_counter() - start
    write_csv(root / "cells.csv", rows)
    write_csv(root / "results.csv", agg)
    write_csv(root / "amplification.csv", [{"recipe": cfg.recipe, **a} for a in amp])
    write_csv(root / "settings.csv", [{"recipe": cfg.recipe, **s} for s in settings.values()])
    save_figures({"mi_vs_ratio.png": plot_mi_vs_ratio(agg, cfg),
                  "amplification.png": plot_amplification(amp, cfg.recipe)}, root)
    (root / "results.md").write_text(render_results(cfg, settings, agg, amp, command, wall, len(rows),
                                                    sum(r["reused"] for r in rows)))
    echo(f"[experiment] done in {wall / 60:.1f} min: {root / 'results.md'}")
    return {"results": agg, "cells": rows, "settings": settings, "amplification": amp, "wall_s": wall}
