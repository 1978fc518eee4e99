"""`tokweight experiment`: posterior collapse and its fix, end to end, as one table.

Per T/(t0+1) setting (the generator's header and length knobs): synthetic data -> the
entangled base model -> its baseline store, each built once (experiments.artefacts);
then a grid of CVAE cells (weighting x beta x seed with a discrete latent of K = #strategies;
the continuous latent for uniform vs surprisal-share; surprisal-share under each z pathway at
the largest T/(t0+1)), each trained and evaluated on the test split with decode-per-latent.

Outputs in DIR: cells.csv (one row per cell and seed), results.csv and results.md (mean
± std over seeds), mi_vs_ratio.png, amplification.png, experiment_config.json. The results file and
the figures are rendered from plain data: the rows, and the config as experiment_config.json holds it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokweight.report.plots import figure, save_figures
from tokweight.report.tables import MISSING, fixed, markdown_table
from tokweight.training.config.components import COND_MODES
from tokweight.training.config.components import default_cond
from tokweight.config_files import preset_config
from tokweight.experiments.artefacts import Echo, TaskConfig, coerce_nested, prepare_all, synthetic_task
from tokweight.experiments.cells import Cell, CellBudget, CellPlan, run_cells
from tokweight.experiments.recipes import recipe_overrides
from tokweight.experiments.results import aggregate, header_lines, mean_std, pm, write_config, write_csv
from tokweight.training.config.components import WEIGHTINGS

ALL_WEIGHTINGS = tuple(WEIGHTINGS)


@dataclass(frozen=True)
class ExperimentConfig:
    """The grid of `tokweight experiment` (``quick`` shrinks it)."""

    out: str
    """Results directory; data/, base/, store/ and runs/ below it are reused across runs."""
    task: TaskConfig = field(default_factory=synthetic_task)
    """Data and base models (experiment/task.toml)."""
    weightings: tuple[str, ...] = ALL_WEIGHTINGS
    """Weightings of the discrete grid."""
    betas: tuple[float, ...] = (1.0, 0.3)
    """KL weights (below about gain / I(z; x,y) the weightings' optima differ; at 1 every weighting can collapse)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of every cell (heads, data order, noise)."""
    continuous_weightings: tuple[str, ...] = ("uniform", "surprisal-share")
    """Weightings of the continuous-latent cells (empty: none)."""
    cond_modes: tuple[str, ...] = ("token", "prefix", "layernorm")
    """z pathways for surprisal-share at the largest setting (``cond`` is the grid's own); the ones the
    published grid ran (any of ``COND_MODES`` may be named)."""
    cond: str | None = None
    """z pathway of the grid's cells; None: train's for each latent (``default_cond``)."""
    prefix_slots: int | None = None
    """Latent slots of the prefix pathway (None: train's)."""
    budget: CellBudget = field(default_factory=CellBudget)
    """Steps and evaluation size per cell."""
    recipe: str = "default"
    """A recipe (tokweight/presets/recipes/) every cell trains with; "default": train's."""
    jobs: int = 1
    """Cells trained at once, each in its own process with one torch thread (no effect on any number)."""

    def __post_init__(self):
        coerce_nested(self, task=TaskConfig, budget=CellBudget)
        if self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs}")
        for name in ("weightings", "betas", "seeds", "continuous_weightings", "cond_modes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        bad = [w for w in self.weightings + self.continuous_weightings if w not in ALL_WEIGHTINGS]
        bad += [c for c in self.cond_modes + ((self.cond,) if self.cond else ()) if c not in COND_MODES]
        if bad:
            raise ValueError(f"unknown weightings or z pathways: {bad}")
        if not self.weightings or not self.betas or not self.seeds:
            raise ValueError("weightings, betas and seeds must be non-empty")
        if any(not b >= 0 for b in self.betas) or (self.prefix_slots or 1) < 1:
            raise ValueError("betas must be >= 0 and prefix_slots >= 1")

    @property
    def plan(self) -> CellPlan:
        return CellPlan(self.task.k, self.prefix_slots, self.budget, self.recipe)


def quick(cfg: ExperimentConfig) -> ExperimentConfig:
    """--quick: ``cfg`` with the preset experiment/grid-quick.toml's fields."""
    return preset_config(ExperimentConfig, "experiment", "grid-quick", on=cfg)


def experiment_cells(cfg: ExperimentConfig) -> list[Cell]:
    names = [s.name for s in cfg.task.settings]
    discrete, continuous = (cfg.cond or default_cond(latent) for latent in ("discrete", "continuous"))
    cells = [Cell(s, "discrete", discrete, w, b, seed) for s in names for w in cfg.weightings
             for b in cfg.betas for seed in cfg.seeds]
    cells += [Cell(s, "continuous", continuous, w, b, seed, "continuous") for s in names
              for w in cfg.continuous_weightings for b in cfg.betas for seed in cfg.seeds]
    cells += [Cell(names[-1], "discrete", c, "surprisal-share", b, seed, "cond") for c in cfg.cond_modes
              if c != discrete for b in cfg.betas for seed in cfg.seeds]
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
    config = asdict(cfg)
    save_figures({"mi_vs_ratio.png": plot_mi_vs_ratio(agg, config),
                  "amplification.png": plot_amplification(amp, cfg.recipe)}, root)
    (root / "results.md").write_text(render_results(config, settings, agg, amp, command, wall, len(rows),
                                                    sum(r["reused"] for r in rows)))
    echo(f"[experiment] done in {wall / 60:.1f} min: {root / 'results.md'}")
    return {"results": agg, "cells": rows, "settings": settings, "amplification": amp, "wall_s": wall}


# ---------------------------------------------------------------- results.md

EVERY_METRIC = ("MI", "I(z; strategy)", "KL", "strategy NMI", "control", "recon")
"""Headers of ``metric_cells``."""


def metric_cells(r: dict) -> list[str]:
    """mean ± std of MI, I(z; strategy), KL, strategy NMI, control accuracy and token-mean recon of an aggregated row."""
    return [pm(r, m) for m in ("mi", "strategy_mi", "kl", "strategy_nmi", "control_accuracy", "recon_uniform")]


def settings_table(settings: dict[str, dict]) -> str:
    lines = [[name, str(s["header_len"]), f"{s['min_len']}-{s['max_len']}", fixed(s["mean_T"], 2),
              fixed(s["mean_t0"], 2), fixed(s["ratio_true"], 2), fixed(s["ratio_inspect"], 2),
              fixed(s["effective_tokens"], 2), f"{fixed(s['base_b_at_t0'])} ({fixed(s['log_consistent_at_t0'])})",
              fixed(s["base_b_after_t0"]), fixed(s["base_val_nll"])] for name, s in settings.items()]
    return markdown_table(["setting", "header", "len(x)", "mean T", "mean t0", "T/(t0+1) generator",
                           "T/(t0+1) inspection (t0_share)", "effective tokens", "base b at t0 (Bayes)",
                           "base b after t0", "base val NLL"], lines)


def render_results(cfg: dict, settings: dict[str, dict], agg: list[dict], amp: list[dict],
                   command: str | None, wall_s: float, n_cells: int, n_reused: int) -> str:
    """results.md; ``cfg`` is the ExperimentConfig as a dict (experiment_config.json's "config")."""
    ratio = {name: s["ratio_true"] for name, s in settings.items()}
    out = header_lines("tokweight experiment: results", cfg["recipe"], command, wall_s, cfg["task"], n_cells,
                       n_reused)
    out += [f"Every number below is from this run: test split, mean ± population std over seeds "
            f"{', '.join(map(str, cfg['seeds']))}; MI is the exact I(z; x,y) of the discrete posterior in nats "
            f"(log K = {math.log(k_of(cfg)):.3f}); recon is the token-mean NLL under q (comparable across "
            f"weightings); control is the decode-per-latent control accuracy.", "",
            "## Settings", "", settings_table(settings), ""]
    out += mi_sections(cfg, agg, ratio) + continuous_section(agg, ratio) + pathway_section(cfg, agg, ratio)
    return "\n".join(out + amplification_section(amp))


def k_of(cfg: dict) -> int:
    """K = the task's number of strategies."""
    return len(cfg["task"]["synth"]["strategies"])


def mi_sections(cfg: dict, agg: list[dict], ratio: dict[str, float]) -> list[str]:
    """Per beta, MI by weighting and setting; then every metric of every discrete token cell."""
    grid = [r for r in agg if r["group"] == "grid"]
    out = []
    for beta in cfg["betas"]:
        cells = {(r["weighting"], r["setting"]): r for r in grid if r["beta"] == beta}
        out += [f"## Discrete latent ({cfg['cond']} pathway), beta = {beta:g}: MI (nats) by weighting and T/(t0+1)",
                "", markdown_table(["weighting"] + [f"{n} ({ratio[n]:.1f})" for n in ratio],
                                   [[w] + [pm(cells.get((w, n), {}), "mi") for n in ratio] for w in cfg["weightings"]]),
                ""]
    long = sorted(grid, key=lambda r: (-r["beta"], ratio[r["setting"]], cfg["weightings"].index(r["weighting"])))
    return out + ["## Discrete latent: every metric", "",
                  markdown_table(["beta", "setting", "T/(t0+1)", "weighting", *EVERY_METRIC],
                                 [[f"{r['beta']:g}", r["setting"], f"{r['ratio_true']:.2f}", r["weighting"],
                                   *metric_cells(r)] for r in long]), ""]


def continuous_section(agg: list[dict], ratio: dict[str, float]) -> list[str]:
    cont = sorted((r for r in agg if r["group"] == "continuous"), key=lambda r: (-r["beta"], ratio[r["setting"]]))
    if not cont:
        return []
    return ["## Continuous latent (NMI of k-means clusters of the posterior means)", "",
            markdown_table(["beta", "setting", "T/(t0+1)", "weighting", "KL", "active units", "strategy NMI",
                            "control", "recon"],
                           [[f"{r['beta']:g}", r["setting"], f"{r['ratio_true']:.2f}", r["weighting"], pm(r, "kl"),
                             pm(r, "active_units"), pm(r, "strategy_nmi"), pm(r, "control_accuracy"),
                             pm(r, "recon_uniform")] for r in cont]), ""]


def pathway_section(cfg: dict, agg: list[dict], ratio: dict[str, float]) -> list[str]:
    """surprisal-share at the largest setting under each z pathway: the grid's own (its discrete cells') and those
    of ``cond_modes``."""
    largest = cfg["task"]["settings"][-1]["name"]
    cond = [r for r in agg if r["setting"] == largest and r["latent"] == "discrete" and r["weighting"] ==
            "surprisal-share" and r["group"] in ("grid", "cond")]
    if not any(r["group"] == "cond" for r in cond):
        return []
    cond.sort(key=lambda r: (-r["beta"], COND_MODES.index(r["cond"])))
    return [f"## surprisal-share under each z pathway at the largest T/(t0+1) ({largest}, {ratio[largest]:.2f})", "",
            markdown_table(["beta", "pathway", *EVERY_METRIC],
                           [[f"{r['beta']:g}", r["cond"], *metric_cells(r)] for r in cond]), ""]


def amplification_section(amp: list[dict]) -> list[str]:
    return ["## Gradient amplification at initialisation", "",
            "||d recon / d posterior head|| at step 0, surprisal-share over uniform, same seed (same heads, "
            "same first batch), against the predicted T/(t0+1).", "",
            markdown_table(["setting", "predicted T/(t0+1) (generator)", "inspection", "effective tokens",
                            "measured ratio", "pairs"],
                           [[a["setting"], fixed(a["ratio_true"], 2), fixed(a["ratio_inspect"], 2),
                             fixed(a["effective_tokens"], 2), measured(a), str(a["pairs"])] for a in amp]), "",
            "![MI against T/(t0+1)](mi_vs_ratio.png)", "", "![gradient amplification](amplification.png)", ""]


def measured(a: dict) -> str:
    """The measured gradient ratio, mean ± std over (beta, seed) pairs."""
    return MISSING if a["measured_mean"] is None else f"{a['measured_mean']:.2f} ± {a['measured_std']:.2f}"


# ---------------------------------------------------------------- figures


def plot_mi_vs_ratio(agg: list[dict], cfg: dict):
    """Exact MI against T/(t0+1), one line per weighting (discrete, token pathway), one panel per beta."""
    fig, axes = figure(len(cfg["betas"]))
    for ax, beta in zip(axes, cfg["betas"]):
        for w in cfg["weightings"]:
            rows = sorted((r for r in agg if r["group"] == "grid" and r["beta"] == beta and r["weighting"] == w),
                          key=lambda r: r["ratio_true"])
            ax.errorbar([r["ratio_true"] for r in rows], [r["mi_mean"] for r in rows],
                        yerr=[r["mi_std"] for r in rows], marker="o", capsize=3, label=w)
        ax.axhline(math.log(k_of(cfg)), color="grey", ls=":", lw=1, label="log K")
        ax.set(xscale="log", xlabel="T/(t0+1) (generator)", ylabel="exact MI (nats)",
               title=f"beta = {beta:g}, recipe {cfg['recipe']}")
        ax.legend(fontsize=7)
    return fig


def plot_amplification(amp: list[dict], recipe: str):
    """Measured gradient ratio at init against predicted T/(t0+1), with the line measured = predicted."""
    fig, (ax,) = figure(1, width=5.5)
    # log axes: a zero ratio (e.g. an E-step recipe trains the posterior head by distillation,
    # so its reconstruction gradient there is 0) has no place on them; the table still shows it
    pts = [a for a in amp if a["measured_mean"] is not None and a["measured_mean"] > 0]
    ax.errorbar([a["ratio_true"] for a in pts], [a["measured_mean"] for a in pts],
                yerr=[a["measured_std"] for a in pts], marker="o", ls="none", capsize=3, label="measured")
    for a in pts:
        ax.annotate(a["setting"], (a["ratio_true"], a["measured_mean"]), fontsize=7)
    if pts:
        lo = min(min(a["ratio_true"], a["measured_mean"]) for a in pts)
        hi = max(max(a["ratio_true"], a["measured_mean"]) for a in pts)
        ax.plot([lo, hi], [lo, hi], color="grey", ls=":", label="measured = predicted")
        ax.set(xscale="log", yscale="log")
    else:
        ax.text(0.5, 0.5, "no positive ratio to show", ha="center", transform=ax.transAxes)
    ax.set(xlabel="predicted T/(t0+1)", ylabel="grad norm ratio, surprisal-share / uniform",
           title=f"posterior gradient at init ({recipe})")
    ax.legend(fontsize=7)
    return fig
