"""`tokweight experiment --sweep beta`: the collapse threshold beta_c per weighting and T/(t0+1).

Where collapse should happen: under uniform token-mean reconstruction the posterior
survives only while (t0/T)|delta| > beta C, under surprisal-share while |delta| > beta C,
so beta_c(surprisal-share) / beta_c(uniform) should be about T/(t0+1). Here, for each setting and weighting, the discrete CVAE is
trained over a log-spaced beta grid (optionally refined by bisection per seed), and

    beta_c = the largest beta whose final exact MI (test split) >= KEPT_FRACTION * log S.

beta_c is also reported with the exact I(z; strategy) in place of I(z; x,y): a code of x or
of y's other tokens counts in the latter (it did in the first em-exact sweep, strategy NMI
0.000-0.001 in every cell), and it is the strategy whose survival is predicted.

The prediction concerns survival: whether a z that is in use outlives beta. So the default
recipe, "survival", starts every cell from the same supervised warm start (z = the true
strategy for 200 steps) and then trains the plain objective at the cell's beta; whether z
can be *found* at all is the learnability question (docs/history/2026-11-latent-learnability.md).

When no beta of the grid kept z there is no beta_c: it is reported as NO_BETA, never
as 0. Data, base models, stores and cells are the experiment grid's (tokweight.experiments),
reused under the same keys. Outputs in DIR: beta_threshold.csv/.md, beta_cells.csv,
mi_vs_beta.png, mi_vs_step.png, sweep_config.json; the Markdown and the figures are rendered from
plain data (rows, and the config as a dict: ``view``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tokweight.report.plots import figure, save_figures
from tokweight.report.tables import fixed, markdown_table
from tokweight.config_files import preset_config
from tokweight.experiments.artefacts import Echo, TaskConfig, coerce_nested, prepare_all, synthetic_task
from tokweight.experiments.cells import Cell, CellBudget, CellPlan, run_cells
from tokweight.experiments.recipes import recipe_overrides
from tokweight.experiments.results import (CRITERIA, NO_BETA, PREDICTION_TOLERANCE, aggregate, beta_c, bracket,
                                                    header_lines, log_grid, mean_std, midpoint, narrow, pm, show, suffix,
                                                    write_config, write_csv)
from tokweight.training.config.use import KEPT_FRACTION, kept_threshold


@dataclass(frozen=True)
class SweepConfig:
    """The beta sweep (``quick_sweep`` shrinks it)."""

    out: str
    """Results directory; shares data/, base/, store/ and runs/ with the experiment when it is the same."""
    task: TaskConfig = field(default_factory=synthetic_task)
    """Data and base models (experiment/task.toml)."""
    settings: tuple[str, ...] = ()
    """Names of the task's settings to sweep; empty: all."""
    weightings: tuple[str, ...] = ("uniform", "sum", "surprisal-share")
    """Weightings compared."""
    betas: tuple[float, ...] = log_grid(0.01, 10.0, 8)
    """The beta grid (sorted on use)."""
    seeds: tuple[int, ...] = (0, 1)
    """Seeds of every cell; beta_c is also reported per seed."""
    refine: int = 0
    """Bisection steps (log scale) per (setting, weighting, seed) between its grid beta_c and the next beta."""
    budget: CellBudget = field(default_factory=lambda: CellBudget(steps=1000, lr=3e-4))
    """Steps and evaluation size per cell: the survival recipe's 200 warm-start steps, then 800 at beta. Near the
    threshold z takes that long to settle, and at a higher learning rate the decoder falls apart on the tokens
    surprisal-share barely weights."""
    recipe: str = "survival"
    """A recipe (tokweight/presets/recipes/) applied to every cell; "default": train's."""
    cond: str = "token"
    """z pathway of every cell."""
    prefix_slots: int = 1
    """Latent slots of the prefix pathway (finding z from scratch needs 2 or more)."""
    jobs: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    """Cells trained at once, each in its own process with one torch thread."""

    def __post_init__(self):
        coerce_nested(self, task=TaskConfig, budget=CellBudget)
        for name in ("settings", "weightings", "seeds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "betas", tuple(sorted(float(b) for b in self.betas)))
        unknown = [s for s in self.settings if s not in {t.name for t in self.task.settings}]
        if unknown:
            raise ValueError(f"unknown settings {unknown}; the task has {[t.name for t in self.task.settings]}")
        if len(self.betas) < 2 or any(not b > 0 for b in self.betas) or len(set(self.betas)) != len(self.betas):
            raise ValueError(f"betas must be >= 2 distinct values > 0 (a log grid), got {self.betas}")
        if not self.weightings or not self.seeds or self.refine < 0 or self.jobs < 1 or self.prefix_slots < 1:
            raise ValueError("weightings and seeds must be non-empty, refine >= 0, jobs >= 1 and prefix_slots >= 1")

    @property
    def setting_names(self) -> tuple[str, ...]:
        return self.settings or tuple(s.name for s in self.task.settings)

    @property
    def threshold(self) -> float:
        """KEPT_FRACTION * log S in nats: the MI at which z counts as kept."""
        return kept_threshold(self.task.k)

    @property
    def plan(self) -> CellPlan:
        return CellPlan(self.task.k, self.prefix_slots, self.budget, self.recipe)


def quick_sweep(cfg: SweepConfig) -> SweepConfig:
    """--quick: ``cfg`` with the preset experiment/sweep-quick.toml's fields, on the largest T/(t0+1) only."""
    return replace(preset_config(SweepConfig, "experiment", "sweep-quick", on=cfg),
                   settings=(cfg.task.settings[-1].name,))


# ---------------------------------------------------------------- running


def sweep_groups(cfg: SweepConfig) -> list[tuple[str, str, int]]:
    """Every (setting, weighting, seed) whose beta_c the sweep measures."""
    return [(s, w, seed) for s in cfg.setting_names for w in cfg.weightings for seed in cfg.seeds]


def grid_cells(cfg: SweepConfig) -> list[Cell]:
    """The grid's cells: every group at every beta (bisection adds one cell per group and round)."""
    return [Cell(s, "discrete", cfg.cond, w, b, seed, "sweep") for s, w, seed in sweep_groups(cfg) for b in cfg.betas]


def run_sweep_cells(cfg: SweepConfig, prepared: dict, root: Path, echo: Echo) -> list[dict]:
    """The grid for every (setting, weighting, seed), then ``refine`` bisection rounds (each round
    one midpoint per (setting, weighting, seed) whose grid beta_c has a larger grid beta above it,
    all run together); one row per cell."""
    def run(cells: list[Cell]) -> list[dict]:
        return run_cells(cells, prepared, cfg.plan, root, echo, cfg.jobs)

    groups = sweep_groups(cfg)
    grid = grid_cells(cfg)
    echo(f"[sweep] {len(cfg.setting_names)} settings x {len(cfg.weightings)} weightings x {len(cfg.seeds)} seeds "
         f"x {len(cfg.betas)} betas = {len(grid)} cells (+ up to {cfg.refine} bisection steps each), "
         f"{cfg.budget.steps} steps per cell, {cfg.jobs} at a time")
    rows = run(grid)
    spans = grid_spans(rows, groups, cfg)
    for _ in range(cfg.refine if spans else 0):
        mids = {g: midpoint(span) for g, span in spans.items()}
        measured = run([Cell(s, "discrete", cfg.cond, w, mids[s, w, seed], seed, "refine") for s, w, seed in spans])
        rows.extend(measured)
        spans = {g: narrow(spans[g], mids[g], r["mi"], cfg.threshold) for g, r in zip(spans, measured)}
    return rows


def grid_spans(rows: list[dict], groups: list[tuple], cfg: SweepConfig) -> dict[tuple, tuple[float, float]]:
    """(setting, weighting, seed) -> the grid span bisection narrows, for the groups that have one."""
    spans = {}
    for s, w, seed in groups:
        mine = {r["beta"]: r["mi"] for r in rows if (r["setting"], r["weighting"], r["seed"]) == (s, w, seed)}
        span = bracket(cfg.betas, beta_c(mine, cfg.threshold))
        if span:
            spans[s, w, seed] = span
    return spans


# ---------------------------------------------------------------- the tables


def grid_means(rows: list[dict]) -> dict[tuple, dict]:
    """(setting, weighting, beta) -> the grid cells' seed mean and std of every metric."""
    return {(r["setting"], r["weighting"], r["beta"]): r for r in aggregate(rows) if r["group"] == "sweep"}


def summarize(rows: list[dict], means: dict[tuple, dict], cfg: SweepConfig, settings: dict[str, dict],
              predicted: dict[tuple[str, str], float | None]) -> list[dict]:
    """beta_c per (setting, weighting) and criterion: of the seed-mean MI curve over the grid, and per
    seed (grid + bisection; bisection follows the first criterion, "mi"); beside it the store's prediction."""
    def row(setting: str, weighting: str) -> dict:
        cells = [r for r in rows if (r["setting"], r["weighting"]) == (setting, weighting)]
        return (summary_row(setting, weighting, cells, means, cfg, settings[setting])
                | prediction_columns(predicted.get((setting, weighting)), cells, cfg))

    return [row(s, w) for s in cfg.setting_names for w in cfg.weightings]


def store_predictions(prepared: dict) -> dict[tuple[str, str], float | None]:
    """(setting, weighting) -> beta_c predicted from the setting's store before any training
    (store.inspection.predicted_beta_c: the gain of a z that removes every b, over its KL cost)."""
    from tokweight.store.inspection import predicted_beta_c
    from tokweight.store.sql import connect

    out = {}
    for name, prep in prepared.items():
        for row in predicted_beta_c(connect(prep.store, [prep.fingerprint])):
            out[name, row["weighting"]] = row["beta_c_predicted"]
    return out


def prediction_columns(predicted: float | None, cells: list[dict], cfg: SweepConfig) -> dict:
    """The prediction, the per-seed beta_c (grid + bisection, by I(z; strategy): the prediction is about a z
    that names the strategy, and a code of x has exact MI without it) over it, and whether every seed lies
    within PREDICTION_TOLERANCE of it."""
    per_seed = [beta_c({r["beta"]: r.get("strategy_mi") for r in cells if r["seed"] == seed}, cfg.threshold)
                for seed in cfg.seeds]
    if predicted is None:
        return {"beta_c_predicted": None, "measured_over_predicted": None, "within_tolerance": None}
    ratios = [b / predicted if b is not None else None for b in per_seed]
    within = all(r is not None and 1 / PREDICTION_TOLERANCE <= r <= PREDICTION_TOLERANCE for r in ratios)
    return {"beta_c_predicted": predicted,
            "measured_over_predicted": ";".join(f"{seed}:{'none' if r is None else f'{r:.2f}'}"
                                                for seed, r in zip(cfg.seeds, ratios)),
            "within_tolerance": "yes" if within else "no"}


def summary_row(setting: str, weighting: str, cells: list[dict], means: dict[tuple, dict], cfg: SweepConfig,
                stats: dict) -> dict:
    row = {"recipe": cfg.recipe, "setting": setting, "ratio_true": stats["ratio_true"],
           "ratio_inspect": stats["ratio_inspect"], "ratio_if_z_removes_b": stats.get("ratio_if_z_removes_b"),
           "weighting": weighting, "threshold_nats": cfg.threshold}
    for metric in CRITERIA:
        curve = {b: means.get((setting, weighting, b), {}).get(f"{metric}_mean") for b in cfg.betas}
        row |= criterion_columns(metric, curve, cells, cfg)
    row["kept_z"] = "yes" if row["beta_c"] != NO_BETA else "no beta in the grid kept z"
    return row | gain_estimate([r for r in cells if r["group"] == "sweep"], cfg.betas, cfg.threshold)


def criterion_columns(metric: str, curve: dict[float, float | None], cells: list[dict], cfg: SweepConfig) -> dict:
    """beta_c by ``metric`` of the seed-mean ``curve``, and per seed over ``cells`` (grid + bisection)."""
    c = suffix(metric)
    per_seed = [beta_c({r["beta"]: r.get(metric) for r in cells if r["seed"] == seed}, cfg.threshold)
                for seed in cfg.seeds]
    found = [b for b in per_seed if b is not None]
    return {f"beta_c{c}": show(beta_c(curve, cfg.threshold)),
            f"beta_c{c}_seeds": ";".join(f"{seed}:{show(b)}" for seed, b in zip(cfg.seeds, per_seed)),
            f"beta_c{c}_seed_min": show(min(found)) if found else NO_BETA,
            f"beta_c{c}_seed_max": show(max(found)) if found else NO_BETA,
            f"seeds_without_beta_c{c}": len(per_seed) - len(found)}


def gain_estimate(cells: list[dict], betas: tuple[float, ...], threshold: float) -> dict:
    """The survival criterion |delta| > beta C read off the grid's own ends: delta = the weighted
    reconstruction the weighting's objective gains by z (recon at the largest beta, which collapsed,
    minus recon at the smallest, which kept z; seed means) and C = the KL at the smallest beta, so
    beta_c ~ delta / C. None where the ends did not collapse and keep z respectively."""
    def mean(metric: str, beta: float) -> float | None:
        return mean_std([r.get(metric) for r in cells if r["beta"] == beta])[0]

    lo, hi = betas[0], betas[-1]
    kept, dropped = mean("mi", lo), mean("mi", hi)
    if None in (kept, dropped) or kept < threshold or dropped >= threshold:
        return {"z_gain_nats": None, "kl_with_z": None, "beta_c_from_gain": None}
    gain, kl = mean("recon", hi) - mean("recon", lo), mean("kl", lo)
    return {"z_gain_nats": gain, "kl_with_z": kl, "beta_c_from_gain": gain / kl if kl > 0 else None}


def measured_ratio(ss: str, uni: str, lowest: float) -> str:
    """beta_c(surprisal-share) / beta_c(uniform) as text; a bound or "undefined" when either has none."""
    if ss != NO_BETA and uni != NO_BETA:
        return f"{float(ss) / float(uni):.3g}"
    if ss != NO_BETA:  # uniform kept z at no beta: the ratio is only bounded below
        return f"> {float(ss) / lowest:.3g} (uniform: {NO_BETA})"
    if uni != NO_BETA:
        return f"< {lowest / float(uni):.3g} (surprisal-share: {NO_BETA})"
    return f"undefined (neither kept z at any beta >= {lowest:g})"


def ratio_rows(summary: list[dict], betas: tuple[float, ...]) -> list[dict]:
    """beta_c(surprisal-share) / beta_c(uniform) per setting (both criteria) next to the predicted T/(t0+1)."""
    out = []
    by = {(r["setting"], r["weighting"]): r for r in summary}
    for s in dict.fromkeys(r["setting"] for r in summary):
        ss, uni = by.get((s, "surprisal-share")), by.get((s, "uniform"))
        if ss is None or uni is None:
            continue
        row = {"recipe": ss["recipe"], "setting": s, "predicted_T_over_t0p1": ss["ratio_true"],
               "inspection_T_over_t0p1": ss["ratio_inspect"],
               "predicted_if_z_removes_b": ss.get("ratio_if_z_removes_b")}
        for metric in CRITERIA:
            c = f"beta_c{suffix(metric)}"
            row |= {f"{c}_surprisal_share": ss[c], f"{c}_uniform": uni[c],
                    f"measured_ratio{suffix(metric)}": measured_ratio(ss[c], uni[c], betas[0])}
        out.append(row)
    return out


# ---------------------------------------------------------------- the job


def view(cfg: SweepConfig) -> dict:
    """What beta_threshold.md and the figures read of the config: the config as a dict (sweep_config.json's
    "config"), the settings swept, the MI threshold and the recipe's overrides."""
    return asdict(cfg) | {"setting_names": cfg.setting_names, "threshold": cfg.threshold,
                          "recipe_overrides": recipe_overrides(cfg.recipe)}


def run(cfg: SweepConfig, echo: Echo = print, command: str | None = None) -> dict:
    start = time.perf_counter()
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    write_config(root / "sweep_config.json", cfg, recipe_overrides(cfg.recipe))
    prepared = prepare_all(cfg.task, root, echo, cfg.setting_names)
    settings = {name: p.stats for name, p in prepared.items()}
    rows = run_sweep_cells(cfg, prepared, root, echo)
    means = grid_means(rows)
    summary = summarize(rows, means, cfg, settings, store_predictions(prepared))
    ratios = ratio_rows(summary, cfg.betas)
    wall = time.perf_counter() - start
    write_csv(root / "beta_cells.csv", rows)
    write_csv(root / "beta_threshold.csv", summary)
    write_csv(root / "beta_ratio.csv", ratios)
    shown = view(cfg)
    save_figures({"mi_vs_beta.png": plot_mi_vs_beta(means, shown, settings),
                  "mi_vs_step.png": plot_mi_vs_step(rows, shown, root)}, root)
    (root / "beta_threshold.md").write_text(render(shown, summary, ratios, rows, means, settings, command, wall))
    echo(f"[sweep] done in {wall / 60:.1f} min: {root / 'beta_threshold.md'}")
    return {"summary": summary, "ratios": ratios, "cells": rows, "settings": settings, "wall_s": wall}


# ---------------------------------------------------------------- beta_threshold.md


def render(cfg: dict, summary: list[dict], ratios: list[dict], rows: list[dict], means: dict[tuple, dict],
           settings: dict[str, dict], command: str | None, wall_s: float) -> str:
    """beta_threshold.md; ``cfg`` is ``view``'s dict."""
    out = header_lines("tokweight experiment --sweep beta: collapse thresholds", cfg["recipe"], command, wall_s,
                       cfg["task"], len(rows), sum(r["reused"] for r in rows))
    out += [definition(cfg), ""] + ratio_section(ratios) + prediction_section(summary) + beta_c_section(summary)
    for s in cfg["setting_names"]:
        for metric, what in CRITERIA.items():
            lines = [[w] + [pm(means.get((s, w, b), {}), metric) for b in cfg["betas"]] for w in cfg["weightings"]]
            out += [f"## {what} (nats) against beta: {s} (T/(t0+1) = {settings[s]['ratio_true']:.2f})", "",
                    markdown_table(["weighting"] + [f"{b:g}" for b in cfg["betas"]], lines), ""]
    out += ["![MI against beta](mi_vs_beta.png)", "", "![batch MI against step](mi_vs_step.png)", ""]
    return "\n".join(out)


def definition(cfg: dict) -> str:
    betas, budget = cfg["betas"], cfg["budget"]
    return (f"beta_c = the largest beta whose final exact MI (test split) >= {KEPT_FRACTION} log S = "
            f"{cfg['threshold']:.3f} nats; '{NO_BETA}' = no beta in the grid kept z (beta_c < {betas[0]:g}, not 0). "
            f"Two MIs: {CRITERIA['mi']} (the definition) and {CRITERIA['strategy_mi']} (codes of x or of y's "
            f"other tokens do not count). Grid: {', '.join(f'{b:g}' for b in betas)}; seeds "
            f"{', '.join(map(str, cfg['seeds']))}; {cfg['refine']} bisection steps per seed; {budget['steps']} "
            f"steps per cell at lr {budget['lr']:g}, recipe overrides {json.dumps(cfg['recipe_overrides'])}. "
            "'beta_c' is that of the seed-mean MI curve over the grid; per seed includes the bisection.")


def ratio_section(ratios: list[dict]) -> list[str]:
    return ["## beta_c(surprisal-share) / beta_c(uniform) against the predicted T/(t0+1)", "",
            markdown_table(["setting", "predicted T/(t0+1)", "inspection", "if z removes every b",
                            "beta_c surprisal-share", "beta_c uniform", "measured ratio", "same, by I(z; strategy)"],
                           [[r["setting"], fixed(r["predicted_T_over_t0p1"], 2), fixed(r["inspection_T_over_t0p1"], 2),
                             fixed(r["predicted_if_z_removes_b"], 2),
                             r["beta_c_surprisal_share"], r["beta_c_uniform"], r["measured_ratio"],
                             (f"{r['beta_c_strategy_mi_surprisal_share']} / {r['beta_c_strategy_mi_uniform']} = "
                              f"{r['measured_ratio_strategy_mi']}")] for r in ratios]), "",
            ("'inspection' is T/(t0_share+1) from the store; 'if z removes every b' is the ratio of the z-gains "
             "mean(sum b^2 / sum b) / mean(sum b / T) (store/sql/summary.sql): T/(t0+1) assumes z helps at t0 only, "
             "this assumes z removes the base model's surprisal at every token."), ""]


def prediction_section(summary: list[dict]) -> list[str]:
    """Predicted (from the store, before training) against measured beta_c, per (setting, weighting)."""
    return ["## beta_c predicted from the store against measured", "",
            markdown_table(["setting", "weighting", "predicted beta_c", "measured beta_c by I(z; strategy)", "per seed", "measured / predicted per seed", f"within {PREDICTION_TOLERANCE:g}x"],
                           [[r["setting"], r["weighting"], fixed(r.get("beta_c_predicted")), r["beta_c_strategy_mi"],
                             r["beta_c_strategy_mi_seeds"], r.get("measured_over_predicted") or "-",
                             r.get("within_tolerance") or "-"] for r in summary]), "",
            ("predicted beta_c = the gain of a z that removes all of the base's surprisal under the weighting "
             "(uniform: mean sum b / T; sum: mean sum b; surprisal-share: mean sum b^2 / sum b) over its KL cost "
             "H(strategy), from the store alone (store/sql/predicted_beta_c.sql; `tokweight inspect` reports it)."), ""]


def beta_c_section(summary: list[dict]) -> list[str]:
    return ["## beta_c per weighting", "",
            markdown_table(["setting", "T/(t0+1)", "weighting", "beta_c", "per seed", "seeds without beta_c",
                            "beta_c by I(z; strategy)", "per seed", "z gain delta (nats)", "C = KL with z",
                            "delta / C"],
                           [[r["setting"], fixed(r["ratio_true"], 2), r["weighting"], r["beta_c"], r["beta_c_seeds"],
                             str(r["seeds_without_beta_c"]), r["beta_c_strategy_mi"], r["beta_c_strategy_mi_seeds"],
                             fixed(r["z_gain_nats"]), fixed(r["kl_with_z"]), fixed(r["beta_c_from_gain"])]
                            for r in summary]), "",
            ("delta = the cell's own weighted reconstruction at the largest beta (z collapsed) minus that at the "
             "smallest (z kept), C = the KL at the smallest, seed means: the note's survival condition "
             "|delta| > beta C puts beta_c near delta / C."), ""]


# ---------------------------------------------------------------- figures


def plot_mi_vs_beta(means: dict[tuple, dict], cfg: dict, settings: dict[str, dict]):
    """Exact MI against beta (log axis, grid cells, mean ± std over seeds): a curve per weighting (dotted: I(z;
    strategy)), a panel per setting."""
    fig, axes = figure(len(cfg["setting_names"]), width=4.8)
    for ax, s in zip(axes, cfg["setting_names"]):
        for i, w in enumerate(cfg["weightings"]):
            for metric, style in (("mi", "-"), ("strategy_mi", ":")):
                cells = [means.get((s, w, b), {}) for b in cfg["betas"]]
                stats = [(c.get(f"{metric}_mean"), c.get(f"{metric}_std")) for c in cells]
                if any(m is not None for m, _ in stats):
                    ax.errorbar(cfg["betas"], [m for m, _ in stats], yerr=[sd for _, sd in stats], marker="o",
                                capsize=3, ls=style, color=f"C{i}",
                                label=w if metric == "mi" else f"{w}, I(z; strategy)")
        ax.axhline(cfg["threshold"], color="grey", ls=":", lw=1, label=f"{KEPT_FRACTION} log S")
        ax.set(xscale="log", xlabel="beta", ylabel="exact MI (nats)",
               title=f"{s}: T/(t0+1) = {settings[s]['ratio_true']:.2f}")
        ax.legend(fontsize=7)
    return fig


def batch_mi(run_dir: Path) -> tuple[list[int], list[float]]:
    """(steps, exact MI of each logged training batch = H(mean_i q_i) - mean_i H(q_i), nats)."""
    import numpy as np

    from tokweight.training.evaluation.metrics import entropy
    from tokweight.training.loop.run_dir import read_metrics

    logged = [r for r in read_metrics(run_dir) if "usage" in r and "q_entropy" in r]
    return [r["step"] for r in logged], [float(entropy(np.asarray(r["usage"])) - r["q_entropy"]) for r in logged]


def plot_mi_vs_step(rows: list[dict], cfg: dict, root: Path):
    """Batch MI against step at the largest swept setting, first seed: the smallest, a middle and the largest beta."""
    s, seed, betas = cfg["setting_names"][-1], cfg["seeds"][0], cfg["betas"]
    shown = sorted({betas[0], betas[len(betas) // 2], betas[-1]})
    fig, axes = figure(len(shown), width=4.5)
    for ax, b in zip(axes, shown):
        for r in rows:
            if (r["setting"], r["seed"], r["beta"], r["group"]) == (s, seed, b, "sweep"):
                ax.plot(*batch_mi(root / "runs" / r["run"]), label=r["weighting"])
        ax.set(xlabel="step", ylabel="batch MI (nats)", title=f"{s}, beta = {b:g}, seed {seed}")
        ax.legend(fontsize=7)
    return fig
