"""Variants of the default on the demo's data and budget (h0-n16, surprisal-share, beta 0.3, 300 steps),
one axis at a time: the z pathway (--conds) and how far the latent rows start from the checkpoint's mean latent
row (--norms, CVAEConfig.latent_init_norm, in units of the token-row spread; without it, the default's).
One row per variant and seed: eval's verdict, exact MI, I(z; strategy), the decoder's token-mean NLL at step 0
(what the z pathway's init costs it) and at the end against the base's, and the decoder's response to z at the
most surprising token (l_t0 spread) at step 0 and at the end.

    python scripts/demo_variants.py OUT [--jobs 2] [--seeds 0,1,2] [--conds prefix,memory] [--norms 1,0.5]

Writes OUT/ (data, base model, store, runs; reused when their keys match), OUT/cells.csv and
OUT/demo_variants.md, and prints the table. A cell's key is its configuration, not the code that trained it:
a root's cells keep the init of the commit that made them (docs/results.md compares the memory pathway's two
inits, and the latent rows' absolute and relative norms, in roots sharing the data, base and store).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from tokweight.report.tables import fixed, markdown_table
from tokweight.demo import demo_preset
from tokweight.experiments.artefacts import prepare_setting
from tokweight.experiments.cells import Cell, CellBudget, CellPlan, run_cells
from tokweight.experiments.results import write_table_run

DEMO = demo_preset("default")
BETA = 0.3  # the default's beta (LossConfig.beta)
WEIGHTING = "surprisal-share"  # the default's
SLOTS = 4  # the prefix pathway's (CVAEConfig.slots)


def run(root: Path, conds: tuple[str, ...], norms: tuple[float | None, ...], seeds: tuple[int, ...],
        jobs: int) -> list[dict]:
    task = DEMO.task
    setting = task.settings[0]
    prep = prepare_setting(task, setting, root, print)
    plan = CellPlan(task.k, SLOTS, CellBudget(steps=DEMO.cvae_steps, decode_examples=DEMO.decode_examples), "default")
    cells = [Cell(setting.name, "discrete", cond, WEIGHTING, BETA, seed, group="cond",
                  overrides=() if norm is None else (("cvae.latent_init_norm", norm),))
             for cond in conds for norm in norms for seed in seeds]
    return run_cells(cells, {setting.name: prep}, plan, root, print, jobs)


def table(rows: list[dict]) -> str:
    out = [[r["cond"], "default" if r.get("cvae.latent_init_norm") is None else f"{r['cvae.latent_init_norm']:g}",
            str(r["seed"]), r["outcome"], fixed(r["mi"]), fixed(r["strategy_mi"]), fixed(r["nll_init"]),
            f"{fixed(r['nll_token_mean'])} ({fixed(r['base_nll_token_mean'])})",
            f"{fixed(r['l_t0_spread_init'])} -> {fixed(r['l_t0_spread_end'])}", f"{r['wall_s']:.0f}"] for r in rows]
    headers = ["cond", "row offset", "seed", "eval verdict", "exact MI", "I(z; strategy)", "NLL at step 0",
               "NLL nats/token at the end (base)", "l_t0 spread step 0 -> end", "wall s"]
    return markdown_table(headers, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--conds", default="prefix,memory")
    ap.add_argument("--norms", default=None, help="comma-separated offsets of the latent rows (default: the default's)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # small models on a shared 2-core machine: more threads oversubscribe it
    seeds = tuple(int(s) for s in args.seeds.split(","))
    norms = (None,) if args.norms is None else tuple(float(n) for n in args.norms.split(","))
    start = time.perf_counter()
    rows = run(args.out, tuple(args.conds.split(",")), norms, seeds, args.jobs)
    wall = time.perf_counter() - start
    command = " ".join(["python scripts/demo_variants.py", str(args.out), f"--jobs {args.jobs}",
                        f"--seeds {args.seeds}",
                        f"--conds {args.conds}", *([f"--norms {args.norms}"] if args.norms else [])])
    write_table_run(args.out, "demo_variants", rows, table(rows),
                    f"{len(rows)} cells, {args.jobs} at a time; wall time {wall / 60:.1f} min (`{command}`).")


if __name__ == "__main__":
    main()
