"""Remedy x weighting ablation: final MI / NMI and steps to reach MI >= 0.5 log S, plus MI against step.

Every cell is one ``training.train.run`` of the same base config with a recipe
(training/recipes.py) and a weighting; runs live in OUT/<recipe>__<weighting>/ (each
with its config.json and metrics.jsonl) and a finished cell is not run again. Outputs:
OUT/ablation.json (every cell's numbers and seed), OUT/ablation.md (the table) and
OUT/mi_vs_step.png. One training process at a time, one thread.

    python scripts/ablate_recipe.py --checkpoint CKPT --data DATA --out OUT [--store STORE]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from pipeline.synth import load_synth_config
from training.train import read_metrics

WEIGHTINGS = ("uniform", "sum", "surprisal-share")


def strategy_count(data: str, k: int) -> int:
    """S: the dataset's number of strategies (a synthetic dataset's config), else K."""
    synth = load_synth_config(data)
    return len(synth.strategies) if synth is not None else k


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, MI, NMI) of every validation line of a run, periodic and final."""
    return [(r["step"], r["mi"], r.get("strategy_nmi", float("nan"))) for r in read_metrics(run_dir)
            if r.get("split") == "val"]


def first_step_at(points: list[tuple[int, float, float]], threshold: float) -> int | None:
    return next((step for step, mi, _ in points if mi >= threshold), None)


def run_cell(base, recipe: str, weighting: str, run_dir: Path) -> dict:
    from dataclasses import replace

    from training.recipes import with_recipe
    from training.train import run

    done = run_dir / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    cfg = with_recipe(replace(base, weighting=weighting, out=str(run_dir)), recipe)
    result = run(cfg)
    done.write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(cells: list[dict], log_s: float) -> str:
    lines = [f"| recipe | weighting | MI (nats; 0.9 log S = {0.9 * log_s:.3f}) | MI / log S | strategy NMI | "
             "steps to MI >= 0.5 log S |", "|---|---|---|---|---|---|"]
    for c in cells:
        reach = "not reached" if c["steps_to_half"] is None else str(c["steps_to_half"])
        lines.append(f"| {c['recipe']} | {c['weighting']} | {c['mi']:.3f} | {c['mi'] / log_s:.2f} | "
                     f"{c['strategy_nmi']:.3f} | {reach} |")
    return "\n".join(lines) + "\n"


def plot(cells: list[dict], log_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WEIGHTINGS), figsize=(4.2 * len(WEIGHTINGS), 3.4), sharey=True)
    for ax, weighting in zip(axes, WEIGHTINGS):
        for c in (c for c in cells if c["weighting"] == weighting):
            steps, mi, _ = zip(*c["curve"])
            ax.plot(steps, mi, marker=".", label=c["recipe"])
        ax.axhline(0.9 * log_s, color="grey", ls="--", lw=0.8)
        ax.axhline(0.5 * log_s, color="grey", ls=":", lw=0.8)
        ax.set_title(weighting)
        ax.set_xlabel("step")
    axes[0].set_ylabel("exact MI (nats)")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--store", default=None, help="Baseline store (policy precomputed); without it: frozen.")
    ap.add_argument("--recipes", default="baseline,spread,em-balanced")
    ap.add_argument("--weightings", default=",".join(WEIGHTINGS))
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-examples", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from training.cvae import CVAEConfig
    from training.schedules import BetaSchedule
    from training.train import TrainConfig

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = TrainConfig(checkpoint=args.checkpoint, data=args.data, out=str(out), store=args.store,
                       policy="precomputed" if args.store else "frozen", cvae=CVAEConfig(k=args.k),
                       beta=BetaSchedule(args.beta), steps=args.steps, batch_size=args.batch_size,
                       eval_every=args.eval_every, eval_examples=args.eval_examples, log_every=10,
                       grad_diag_every=0, ckpt_every=args.steps, num_workers=0, seed=args.seed)
    log_s = math.log(strategy_count(args.data, args.k))
    cells = []
    for recipe in args.recipes.split(","):
        for weighting in args.weightings.split(","):
            run_dir = out / f"{recipe}__{weighting}"
            result = run_cell(base, recipe, weighting, run_dir)
            points = curve(run_dir)
            cells.append({"recipe": recipe, "weighting": weighting, "seed": args.seed, "steps": args.steps,
                          "beta": args.beta, "mi": result["mi"], "strategy_nmi": result.get("strategy_nmi", float("nan")),
                          "val_examples": result["examples"], "train_wall_s": result["train_wall_s"],
                          "steps_to_half": first_step_at(points, 0.5 * log_s), "curve": points})
            print(f"{recipe:>12} {weighting:>16}: MI {result['mi']:.3f}  NMI {cells[-1]['strategy_nmi']:.3f}", flush=True)
    (out / "ablation.json").write_text(json.dumps({"log_S": log_s, "cells": cells}, indent=1) + "\n")
    (out / "ablation.md").write_text(table(cells, log_s))
    plot(cells, log_s, out / "mi_vs_step.png")
    print(table(cells, log_s))


if __name__ == "__main__":
    main()
