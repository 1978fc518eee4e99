"""The experiment grid's results.md and its figures (MI against T/(t0+1), gradient amplification)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tokweight.report.plots import figure
from tokweight.report.tables import MISSING, fixed, markdown_table
from tokweight.training.configs import COND_MODES
from tokweight.training.experiments.report import header_lines, pm

if TYPE_CHECKING:
    from tokweight.training.experiments.grid import ExperimentConfig

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


def render_results(cfg: ExperimentConfig, settings: dict[str, dict], agg: list[dict], amp: list[dict],
                   command: str | None, wall_s: float, n_cells: int, n_reused: int) -> str:
    ratio = {name: s["ratio_true"] for name, s in settings.items()}
    out = header_lines("tokweight experiment: results", cfg.recipe, command, wall_s, cfg.task, n_cells, n_reused)
    out += [f"Every number below is from this run: test split, mean ± population std over seeds "
            f"{', '.join(map(str, cfg.seeds))}; MI is the exact I(z; x,y) of the discrete posterior in nats "
            f"(log K = {math.log(cfg.task.k):.3f}); recon is the token-mean NLL under q (comparable across "
            f"weightings); control is the decode-per-latent control accuracy.", "",
            "## Settings", "", settings_table(settings), ""]
    out += mi_sections(cfg, agg, ratio) + continuous_section(agg, ratio) + pathway_section(cfg, agg, ratio)
    return "\n".join(out + amplification_section(amp))


def mi_sections(cfg: ExperimentConfig, agg: list[dict], ratio: dict[str, float]) -> list[str]:
    """Per beta, MI by weighting and setting; then every metric of every discrete token cell."""
    grid = [r for r in agg if r["group"] == "grid"]
    out = []
    for beta in cfg.betas:
        cells = {(r["weighting"], r["setting"]): r for r in grid if r["beta"] == beta}
        out += [f"## Discrete latent ({cfg.cond} pathway), beta = {beta:g}: MI (nats) by weighting and T/(t0+1)", "",
                markdown_table(["weighting"] + [f"{n} ({ratio[n]:.1f})" for n in ratio],
                               [[w] + [pm(cells.get((w, n), {}), "mi") for n in ratio] for w in cfg.weightings]), ""]
    long = sorted(grid, key=lambda r: (-r["beta"], ratio[r["setting"]], cfg.weightings.index(r["weighting"])))
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


def pathway_section(cfg: ExperimentConfig, agg: list[dict], ratio: dict[str, float]) -> list[str]:
    """surprisal-share at the largest setting under each z pathway (the grid's cells are the token pathway)."""
    largest = cfg.task.settings[-1].name
    cond = [r for r in agg if r["setting"] == largest and r["latent"] == "discrete"
            and r["weighting"] == "surprisal-share" and r["group"] in ("grid", "cond") and r["cond"] in cfg.cond_modes]
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


def plot_mi_vs_ratio(agg: list[dict], cfg: ExperimentConfig):
    """Exact MI against T/(t0+1), one line per weighting (discrete, token pathway), one panel per beta."""
    fig, axes = figure(len(cfg.betas))
    for ax, beta in zip(axes, cfg.betas):
        for w in cfg.weightings:
            rows = sorted((r for r in agg if r["group"] == "grid" and r["beta"] == beta and r["weighting"] == w),
                          key=lambda r: r["ratio_true"])
            ax.errorbar([r["ratio_true"] for r in rows], [r["mi_mean"] for r in rows],
                        yerr=[r["mi_std"] for r in rows], marker="o", capsize=3, label=w)
        ax.axhline(math.log(cfg.task.k), color="grey", ls=":", lw=1, label="log K")
        ax.set(xscale="log", xlabel="T/(t0+1) (generator)", ylabel="exact MI (nats)",
               title=f"beta = {beta:g}, recipe {cfg.recipe}")
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
