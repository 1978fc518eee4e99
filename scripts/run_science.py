"""Issue #18's runs: the from-scratch recipe's main table, the decoder-keeping comparison, the map of
pathway x T/(t0+1) x weighting, and the from-scratch beta sweep, on the experiment's task.

    python scripts/run_science.py ROOT PHASE [--steps N]

ROOT holds data/, base/, store/ and runs/ (content-keyed, shared by every phase, so a rerun resumes
and a cell two phases share is trained once); each phase writes its tables to ROOT/tables/PHASE/ (those of
the runs docs/history/ records are in docs/history/results/from-scratch/). Cells run one at a time, one torch
thread.
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from tokweight.experiments import grid
from tokweight.experiments.artefacts import Setting, prepare_all, synthetic_task
from tokweight.experiments.cells import Cell, CellBudget, CellPlan, run_cells
from tokweight.experiments.results import write_csv

LONG = Setting("h0-n32", 0, 32, 32)
"""The longer setting of the map: T = 33, T/(t0+1) about 33."""
MAIN_SETTINGS = tuple(s.name for s in synthetic_task().settings)
TASK = replace(synthetic_task(), settings=synthetic_task().settings + (LONG,))
RECIPE = "default"  # the from-scratch recipe these runs found, now train's default remedies
LR, WARMUP = 3e-4, 100


def tables(root: Path) -> Path:
    """Where the phases write their tables and figures."""
    return root / "tables"


def budget(steps: int) -> CellBudget:
    """Every phase's cells: lr 3e-4, beta warmed over 100 steps (the issue's probes)."""
    return CellBudget(steps=steps, lr=LR, beta_warmup_steps=WARMUP)


def prepared(root: Path, names: tuple[str, ...] = ()) -> dict:
    return prepare_all(TASK, root, print, names)


def main_table(root: Path, steps: int) -> dict:
    """Point 1: 3 settings x {uniform, sum, surprisal-share} x beta {0.3, 1} x 3 seeds, prefix pathway, 4 slots."""
    cfg = grid.ExperimentConfig(out=str(root), weightings=("uniform", "sum", "surprisal-share"), betas=(1.0, 0.3),
                                seeds=(0, 1, 2), continuous_weightings=(), cond_modes=("prefix",), cond="prefix",
                                prefix_slots=4, budget=budget(steps), recipe=RECIPE, jobs=1)
    result = grid.run(cfg, command=f"scripts/run_science.py {root} main --steps {steps}")
    copy_outputs(root, tables(root) / "main", ("results.md", "results.csv", "cells.csv", "mi_vs_ratio.png",
                                                "settings.csv", "experiment_config.json"))
    return result


def full_grid(root: Path, steps: int) -> dict:
    """Point 5: the experiment's grid under the shipped recipe, prefix-4, every discrete weighting, 3 seeds, and
    surprisal-share under the token and layernorm pathways at h0-n16. No continuous cells: the recipe's remedies
    are for a discrete latent (TrainConfig refuses them on a continuous one)."""
    cfg = grid.ExperimentConfig(out=str(root), continuous_weightings=(), cond="prefix", prefix_slots=4,
                                budget=budget(steps), recipe=RECIPE, jobs=1)
    result = grid.run(cfg, command=f"scripts/run_science.py {root} grid --steps {steps}")
    copy_outputs(root, tables(root) / "grid", ("results.md", "results.csv", "cells.csv", "mi_vs_ratio.png",
                                                "settings.csv", "experiment_config.json"))
    return result


def copy_outputs(root: Path, dest: Path, names: tuple[str, ...]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (root / name).is_file():
            shutil.copy(root / name, dest / name)


def run_plan(cells: list[Cell], plan: CellPlan, root: Path, variant: str) -> list[dict]:
    rows = run_cells(cells, prepared(root, tuple(dict.fromkeys(c.setting for c in cells))), plan, root, print)
    return [{"variant": variant, "slots": plan.prefix_slots if r["cond"] == "prefix" else 1, **r} for r in rows]


# ---------------------------------------------------------------- point 3: keeping the decoder whole

DECODER_SETTINGS = ("h3-n5", "h0-n16")
"""Where surprisal-share at lambda = 1 broke the decoder before (control 0.00-0.47 in h3-n5; 0.80 at h0-n16)."""
DECODER_VARIANTS = {
    "lambda=1 (main table)": ({}, LR, RECIPE),
    "anchor w=1 m=0.05": ({"anchor_weight": 1.0, "anchor_margin": 0.05}, LR, RECIPE),
    "anchor w=1 m=0.05 from step 100": ({"anchor_weight": 1.0, "anchor_margin": 0.05, "anchor_start_step": 100}, LR,
                                        RECIPE),
    "lambda=0.5": ({"token_weighted_reconstruction_weight": 0.5}, LR, RECIPE),
    "lr 1e-4": ({}, 1e-4, RECIPE),
}
"""name -> (LossConfig fields, lr, recipe): the anchor term against the older repairs, on surprisal-share."""


def decoder(root: Path, steps: int, beta: float = 0.3, variants: tuple[str, ...] = tuple(DECODER_VARIANTS)) -> None:
    """Point 3: each variant on surprisal-share, prefix-4, at ``beta``, 3 seeds, the two settings."""
    cells = [Cell(s, "discrete", "prefix", "surprisal-share", beta, seed) for s in DECODER_SETTINGS for seed in (0, 1, 2)]
    rows = []
    for name in variants:
        loss, lr, recipe = DECODER_VARIANTS[name]
        plan = CellPlan(TASK.k, 4, replace(budget(steps), lr=lr), recipe, tuple(sorted(loss.items())))
        rows += run_plan(cells, plan, root, name)
    base = {s: prepared(root, (s,))[s].stats["base_val_nll"] for s in DECODER_SETTINGS}
    dest = tables(root) / ("decoder" if beta == 0.3 else f"decoder-beta-{beta:g}")
    write_table(DECODER_TABLE, rows, dest, extra={"base_val_nll": lambda r: base[r["setting"]]})
    (dest / "summary.md").write_text(decoder_summary(rows, base) + "\n")
    print(decoder_summary(rows, base))


def decoder_summary(rows: list[dict], base: dict[str, float]) -> str:
    """Per (variant, setting): the seeds' I(z; strategy), control and NLL, and whether point 3's target held."""
    from tokweight.report.tables import markdown_table

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["setting"]), []).append(r)

    def seeds(rs: list[dict], key: str) -> str:
        return " / ".join(f"{r[key]:.3f}" for r in rs)

    lines = [[v, s, seeds(rs, "strategy_mi"), seeds(rs, "control_accuracy"), seeds(rs, "recon_uniform"),
              f"{base[s]:.3f}", "yes" if all(r["control_accuracy"] >= 0.9 and r["recon_uniform"] <= base[s] + 0.05
                                             for r in rs) else "no"] for (v, s), rs in groups.items()]
    return markdown_table(["variant", "setting", "I(z; strategy) per seed", "control per seed",
                           "token-mean NLL per seed", "base val NLL", "control >= 0.9 and NLL <= base + 0.05, every seed"],
                          lines)


# ---------------------------------------------------------------- point 2: the map

MAP_PATHWAYS = (("token", 1), ("prefix", 2), ("prefix", 4), ("layernorm", 1), ("memory", 1))
"""The memory pathway writes no slot (its one slot keeps a placeholder). No 8-slot prefix: the base models
reserve context for 4 slots (BaseTrainConfig.max_slots), 8 exceed the h1-n8 block of 32 tokens, and where
they fit the base never saw them (h3-n5, surprisal-share: control 0.000, NLL 3.385)."""
MAP_WEIGHTINGS = ("uniform", "surprisal-share")
MAP_SEEDS = (0, 1, 2)
"""Seeds of the map; --seeds runs the first few (the budget ran seed 0 first)."""


def pathway(cond: str, slots: int) -> str:
    return f"prefix-{slots}" if cond == "prefix" else cond


def map_grid(root: Path, steps: int, seeds: int = 1, pathways: tuple[str, ...] = ()) -> None:
    """Point 2, reduced: pathway x 4 settings x {uniform, surprisal-share}, beta 0.3, the first ``seeds`` seeds;
    ``pathways`` (names as ``pathway`` gives them) runs some of MAP_PATHWAYS, into map-<their names>/."""
    chosen = [(c, k) for c, k in MAP_PATHWAYS if not pathways or pathway(c, k) in pathways]
    if not chosen:
        raise SystemExit(f"--pathways: none of {list(pathways)} is a map pathway "
                         f"({', '.join(pathway(c, k) for c, k in MAP_PATHWAYS)})")
    rows = []
    for cond, slots in chosen:
        cells = [Cell(s.name, "discrete", cond, w, 0.3, seed) for seed in MAP_SEEDS[:seeds] for s in TASK.settings
                 for w in MAP_WEIGHTINGS]
        rows += [{**r, "pathway": pathway(cond, slots)}
                 for r in run_plan(cells, CellPlan(TASK.k, slots, budget(steps), RECIPE), root, "map")]
    name = "map" if len(chosen) == len(MAP_PATHWAYS) else "-".join(["map", *(pathway(*p) for p in chosen)])
    dest = tables(root) / name
    write_table(MAP_TABLE, rows, dest)
    (dest / "summary.md").write_text(map_summary(rows, chosen) + "\n")
    print(map_summary(rows, chosen))
    from tokweight.report.plots import save_figures

    save_figures({"strategy_mi_map.png": plot_map(rows, chosen)}, dest)


def map_summary(rows: list[dict], pathways: list[tuple[str, int]]) -> str:
    """Per pathway and weighting, per setting: the seeds that kept z (I(z; strategy) >= ½ log S) and the
    mean I(z; strategy); then the mean l_t0 spread at step 0 and at the end."""
    from tokweight.report.tables import markdown_table
    from tokweight.experiments.results import mean_std

    settings = [s.name for s in TASK.settings]
    kept = 0.5 * math.log(TASK.k)
    lines = []
    for cond, slots in pathways:
        for w in MAP_WEIGHTINGS:
            cells = {s: [r for r in rows if (r["pathway"], r["weighting"], r["setting"]) == (pathway(cond, slots), w, s)]
                     for s in settings}
            mi = [f"{sum(r['strategy_mi'] >= kept for r in cs)}/{len(cs)}, {mean_std([r['strategy_mi'] for r in cs])[0]:.3f}"
                  for cs in cells.values()]
            spread = [f"{mean_std([r['l_t0_spread_init'] for r in cs])[0]:.3f} -> "
                      f"{mean_std([r['l_t0_spread_end'] for r in cs])[0]:.2f}" for cs in cells.values()]
            lines.append([pathway(cond, slots), w, *mi, " / ".join(spread)])
    return markdown_table(["pathway", "weighting", *[f"{s}: seeds kept, mean I(z; strategy)" for s in settings],
                           "mean l_t0 spread, step 0 -> end (same order)"], lines)


def plot_map(rows: list[dict], pathways: list[tuple[str, int]]):
    """I(z; strategy) as a pathway x T/(t0+1) image (mean over the seeds run), one panel per weighting."""
    from tokweight.report.plots import figure
    from tokweight.experiments.results import mean_std

    ratios = sorted({(r["ratio_true"], r["setting"]) for r in rows})
    names = [pathway(c, k) for c, k in pathways]
    fig, axes = figure(len(MAP_WEIGHTINGS), width=4.8, height=3.8)
    for ax, w in zip(axes, MAP_WEIGHTINGS):
        value = {(p, s): mean_std([r["strategy_mi"] for r in rows if (r["weighting"], r["pathway"], r["setting"])
                                   == (w, p, s)])[0] for p in names for _, s in ratios}
        image = [[float("nan") if value[p, s] is None else value[p, s] for _, s in ratios] for p in names]
        shown = ax.imshow(image, vmin=0, vmax=0.7, cmap="viridis", aspect="auto")
        for i, line in enumerate(image):
            for j, v in enumerate(line):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.35 else "black", fontsize=8)
        ax.set(xticks=range(len(ratios)), xticklabels=[f"{s}\n{x:.1f}" for x, s in ratios], yticks=range(len(names)),
               yticklabels=names, xlabel="setting, T/(t0+1)", title=f"I(z; strategy), {w}, beta 0.3")
        fig.colorbar(shown, ax=ax, label="nats")
    return fig


# ---------------------------------------------------------------- point 4: beta_c from scratch

SWEEP_BETAS = (0.1, 0.3, 1.0, 3.0)
"""The main table's two betas and one on each side, seed 0 only (the budget); two bisection steps then
narrow each beta_c to a factor 3^(1/4) = 1.32, inside the 1.5x the prediction is held to."""
SWEEP_REFINE = 2


def beta_sweep(root: Path, steps: int) -> None:
    """Point 4: the beta sweep under the from-scratch recipe (prefix-4), seed 0, with the store's prediction."""
    from tokweight.experiments import sweep as sw

    cfg = sw.SweepConfig(out=str(root), settings=MAIN_SETTINGS, betas=SWEEP_BETAS, seeds=(0,), budget=budget(steps),
                         recipe=RECIPE, cond="prefix", prefix_slots=4, refine=SWEEP_REFINE, jobs=1)
    sw.run(cfg, command=f"scripts/run_science.py {root} sweep --steps {steps}")
    copy_outputs(root, tables(root) / "sweep", ("beta_threshold.md", "beta_threshold.csv", "beta_cells.csv",
                                                 "beta_ratio.csv", "mi_vs_beta.png", "mi_vs_step.png",
                                                 "sweep_config.json"))


# ---------------------------------------------------------------- tables

COLUMNS = {"setting": "setting", "ratio_true": "T/(t0+1)", "weighting": "weighting", "beta": "beta", "seed": "seed",
           "mi": "exact MI", "strategy_mi": "I(z; strategy)", "strategy_nmi": "NMI", "control_accuracy": "control",
           "recon_uniform": "token-mean NLL", "l_t0_spread_init": "l_t0 spread, step 0",
           "l_t0_spread_end": "l_t0 spread, end", "wall_s": "wall s"}
DECODER_TABLE = {"variant": "variant", **COLUMNS, "base_val_nll": "base val NLL"}
MAP_TABLE = {"pathway": "pathway", **COLUMNS}


def write_table(columns: dict[str, str], rows: list[dict], dest: Path, extra: dict | None = None) -> None:
    """rows.csv and table.md (one row per cell, as run) in ``dest``; also printed."""
    from tokweight.report.tables import records_table

    rows = [{**r, **{k: f(r) for k, f in (extra or {}).items()}} for r in rows]
    dest.mkdir(parents=True, exist_ok=True)
    write_csv(dest / "rows.csv", rows)
    table = records_table(rows, columns)
    (dest / "table.md").write_text(table + "\n")
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("phase", choices=sorted(PHASES))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, default=1, help="map: how many of its seeds to run")
    parser.add_argument("--pathways", default="", help="map: run only these of its pathways (comma-separated, "
                        "e.g. memory,prefix-4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    run = PHASES[args.phase]
    if args.phase == "map":
        run(args.root, args.steps, args.seeds, tuple(filter(None, args.pathways.split(","))))
    else:
        run(args.root, args.steps)
    print(f"[science] {args.phase} done in {(time.perf_counter() - start) / 60:.1f} min")


def timing(root: Path, steps: int) -> None:
    """One cell of the main table, to size the budget."""
    cell = Cell("h0-n16", "discrete", "prefix", "surprisal-share", 0.3, 0)
    rows = run_plan([cell], CellPlan(TASK.k, 4, budget(steps), RECIPE), root, "timing")
    print({k: rows[0].get(k) for k in ("mi", "strategy_mi", "control_accuracy", "recon_uniform", "wall_s",
                                       "train_wall_s", "l_t0_spread_init", "l_t0_spread_end")})


def anchor_late(root: Path, steps: int) -> None:
    """The anchor from step 100 (after the warm-up, once z is found) at beta 0.3 and 1. Only its cells run: the
    field it adds moved every cell key, so the earlier variants' rows are read from their rows.csv."""
    import csv

    name = "anchor w=1 m=0.05 from step 100"
    loss, lr, recipe = DECODER_VARIANTS[name]
    base = {s: prepared(root, (s,))[s].stats["base_val_nll"] for s in DECODER_SETTINGS}
    for beta, earlier in ((0.3, tables(root) / "decoder"), (1.0, tables(root) / "decoder-beta-1")):
        cells = [Cell(s, "discrete", "prefix", "surprisal-share", beta, seed) for s in DECODER_SETTINGS
                 for seed in (0, 1, 2)]
        rows = run_plan(cells, CellPlan(TASK.k, 4, replace(budget(steps), lr=lr), recipe, tuple(sorted(loss.items()))),
                        root, name)
        with (earlier / "rows.csv").open() as f:
            before = [{k: float(v) if k in NUMBERS else v for k, v in r.items()} for r in csv.DictReader(f)]
        dest = tables(root) / f"decoder-anchor-late-beta-{beta:g}"
        write_table(DECODER_TABLE, rows, dest, extra={"base_val_nll": lambda r: base[r["setting"]]})
        (dest / "summary.md").write_text(decoder_summary(before + rows, base) + "\n")
        print(decoder_summary(before + rows, base))


NUMBERS = ("strategy_mi", "control_accuracy", "recon_uniform")


PHASES = {"prep": lambda root, steps: prepared(root), "time": timing, "main": main_table, "decoder": decoder,
          "map": map_grid, "sweep": beta_sweep, "grid": full_grid,
          "decoder-beta-1": lambda root, steps: decoder(root, steps, 1.0, ("lambda=1 (main table)", "anchor w=1 m=0.05",
                                                                           "lambda=0.5")),
          "anchor-late": anchor_late}

if __name__ == "__main__":
    main()
