"""The beta sweep's beta_threshold.md and its figures (MI against beta, batch MI against step)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokweight.report.plots import figure
from tokweight.report.tables import fixed, markdown_table
from tokweight.training.experiments.collapse import (
    CRITERIA,
    KEPT_FRACTION,
    NO_BETA,
    PREDICTION_TOLERANCE,
)
from tokweight.training.experiments.report import header_lines, pm
from tokweight.training.metrics import entropy
from tokweight.training.experiments.recipes import recipe_overrides

if TYPE_CHECKING:
    from tokweight.training.experiments.sweep import SweepConfig


def render(cfg: SweepConfig, summary: list[dict], ratios: list[dict], rows: list[dict], means: dict[tuple, dict],
           settings: dict[str, dict], command: str | None, wall_s: float) -> str:
    out = header_lines("tokweight experiment --sweep beta: collapse thresholds", cfg.recipe, command, wall_s,
                       cfg.task, len(rows), sum(r["reused"] for r in rows))
    out += [definition(cfg), ""] + ratio_section(ratios) + prediction_section(summary) + beta_c_section(summary)
    for s in cfg.setting_names:
        for metric, what in CRITERIA.items():
            lines = [[w] + [pm(means.get((s, w, b), {}), metric) for b in cfg.betas] for w in cfg.weightings]
            out += [f"## {what} (nats) against beta: {s} (T/(t0+1) = {settings[s]['ratio_true']:.2f})", "",
                    markdown_table(["weighting"] + [f"{b:g}" for b in cfg.betas], lines), ""]
    out += ["![MI against beta](mi_vs_beta.png)", "", "![batch MI against step](mi_vs_step.png)", ""]
    return "\n".join(out)


def definition(cfg: SweepConfig) -> str:
    return (f"beta_c = the largest beta whose final exact MI (test split) >= {KEPT_FRACTION} log S = "
            f"{cfg.threshold:.3f} nats; '{NO_BETA}' = no beta in the grid kept z (beta_c < {cfg.betas[0]:g}, not 0). "
            f"Two MIs: {CRITERIA['mi']} (the definition) and {CRITERIA['strategy_mi']} (codes of x or of y's "
            f"other tokens do not count). Grid: {', '.join(f'{b:g}' for b in cfg.betas)}; seeds "
            f"{', '.join(map(str, cfg.seeds))}; {cfg.refine} bisection steps per seed; {cfg.budget.steps} "
            f"steps per cell at lr {cfg.budget.lr:g}, recipe overrides {json.dumps(recipe_overrides(cfg.recipe))}. "
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
             "H(strategy), from the store alone (store.report.PREDICTED_BETA_C; `tokweight inspect` reports it)."), ""]


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


def plot_mi_vs_beta(means: dict[tuple, dict], cfg: SweepConfig, settings: dict[str, dict]):
    """Exact MI against beta (log axis, grid cells, mean ± std over seeds): a curve per weighting (dotted: I(z;
    strategy)), a panel per setting."""
    fig, axes = figure(len(cfg.setting_names), width=4.8)
    for ax, s in zip(axes, cfg.setting_names):
        for i, w in enumerate(cfg.weightings):
            for metric, style in (("mi", "-"), ("strategy_mi", ":")):
                cells = [means.get((s, w, b), {}) for b in cfg.betas]
                stats = [(c.get(f"{metric}_mean"), c.get(f"{metric}_std")) for c in cells]
                if any(m is not None for m, _ in stats):
                    ax.errorbar(cfg.betas, [m for m, _ in stats], yerr=[sd for _, sd in stats], marker="o", capsize=3,
                                ls=style, color=f"C{i}", label=w if metric == "mi" else f"{w}, I(z; strategy)")
        ax.axhline(cfg.threshold, color="grey", ls=":", lw=1, label=f"{KEPT_FRACTION} log S")
        ax.set(xscale="log", xlabel="beta", ylabel="exact MI (nats)",
               title=f"{s}: T/(t0+1) = {settings[s]['ratio_true']:.2f}")
        ax.legend(fontsize=7)
    return fig


def batch_mi(run_dir: Path) -> tuple[list[int], list[float]]:
    """(steps, exact MI of each logged training batch = H(mean_i q_i) - mean_i H(q_i), nats)."""
    from tokweight.training.run_dir import read_metrics

    logged = [r for r in read_metrics(run_dir) if "usage" in r and "q_entropy" in r]
    return [r["step"] for r in logged], [float(entropy(np.asarray(r["usage"])) - r["q_entropy"]) for r in logged]


def plot_mi_vs_step(rows: list[dict], cfg: SweepConfig, root: Path):
    """Batch MI against step at the largest swept setting, first seed: the smallest, a middle and the largest beta."""
    s, seed = cfg.setting_names[-1], cfg.seeds[0]
    shown = sorted({cfg.betas[0], cfg.betas[len(cfg.betas) // 2], cfg.betas[-1]})
    fig, axes = figure(len(shown), width=4.5)
    for ax, b in zip(axes, shown):
        for r in rows:
            if (r["setting"], r["seed"], r["beta"], r["group"]) == (s, seed, b, "sweep"):
                ax.plot(*batch_mi(root / "runs" / r["run"]), label=r["weighting"])
        ax.set(xlabel="step", ylabel="batch MI (nats)", title=f"{s}, beta = {b:g}, seed {seed}")
        ax.legend(fontsize=7)
    return fig
