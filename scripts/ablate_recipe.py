"""Remedy x weighting ablation: final MI / NMI and steps to reach MI >= 0.5 log S, plus MI against step.

Every cell is one ``training.train.run`` of the same base config with a recipe
(training/recipes.py) and a weighting (training/experiments/ablation.py); runs live in
OUT/<recipe>__<weighting>/ (each with its config.json and metrics.jsonl) and a finished cell
is not run again. Outputs: OUT/ablation.json (every cell's numbers and seed), OUT/ablation.md
(the table) and OUT/mi_vs_step.png. One training process at a time, one thread.

    python scripts/ablate_recipe.py --checkpoint CKPT --data DATA --out OUT [--store STORE]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from tokweight.training.experiments.ablation import WEIGHTINGS, measure, plot, strategy_count, table


def parse_args() -> argparse.Namespace:
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
    return ap.parse_args()


def base_config(args: argparse.Namespace, out: Path):
    from tokweight.training.cvae import CVAEConfig
    from tokweight.training.schedules import BetaSchedule
    from tokweight.training.train_config import IOConfig, LogConfig, LossConfig, OptimConfig, TrainConfig

    return TrainConfig(io=IOConfig(checkpoint=args.checkpoint, data=args.data, out=str(out), store=args.store,
                                   num_workers=0),
                       cvae=CVAEConfig(k=args.k),
                       loss=LossConfig(policy="precomputed" if args.store else "frozen", beta=BetaSchedule(args.beta)),
                       optim=OptimConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed),
                       log=LogConfig(eval_every=args.eval_every, eval_examples=args.eval_examples, log_every=10,
                                     grad_diag_every=0, ckpt_every=args.steps))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = base_config(args, out)
    log_s = math.log(strategy_count(args.data, args.k))
    cells = []
    for recipe in args.recipes.split(","):
        for weighting in args.weightings.split(","):
            cells.append(measure(base, recipe, weighting, out, log_s))
            print(f"{recipe:>12} {weighting:>16}: MI {cells[-1]['mi']:.3f}  NMI {cells[-1]['strategy_nmi']:.3f}",
                  flush=True)
    (out / "ablation.json").write_text(json.dumps({"log_S": log_s, "cells": cells}, indent=1) + "\n")
    (out / "ablation.md").write_text(table(cells, log_s))
    plot(cells, log_s, out / "mi_vs_step.png")
    print(table(cells, log_s))


if __name__ == "__main__":
    main()
