"""The memory z pathway against the default 4-slot prefix on the demo's data and budget (h0-n16, the default
recipe, 300 steps), one row per seed: eval's verdict, exact MI, I(z; strategy), token-mean NLL against the
base's, the decoder's response to z at the most surprising token (l_t0 spread) at step 0 and at the end.

    python scripts/memory_pathway.py OUT [--jobs 2] [--seeds 0,1,2] [--conds prefix,memory]

Writes OUT/ (data, base model, store, runs; reused when their keys match), OUT/cells.csv and
OUT/memory_pathway.md, and prints the table. A cell's key is its configuration, not the code that trained it:
a root's memory cells keep the projection init of the commit that made them (docs/results.md, "The memory
pathway", compares two inits in two roots sharing the data, base and store).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from tokweight.report.tables import fixed, markdown_table
from tokweight.training.demo import PRESETS
from tokweight.training.experiments.artefacts import prepare_setting
from tokweight.training.experiments.cells import Cell, CellBudget, CellPlan, run_cells
from tokweight.training.experiments.results import write_table_run

DEMO = PRESETS["default"]
BETA = 0.3  # the default's beta (BetaSchedule)
WEIGHTING = "surprisal-share"  # the default's


def run(root: Path, conds: tuple[str, ...], seeds: tuple[int, ...], jobs: int) -> list[dict]:
    task = DEMO.task
    setting = task.settings[0]
    prep = prepare_setting(task, setting, root, print)
    plan = CellPlan(task.k, 4, CellBudget(steps=DEMO.cvae_steps, decode_examples=DEMO.decode_examples), "default")
    cells = [Cell(setting.name, "discrete", cond, WEIGHTING, BETA, seed, group="cond") for cond in conds
             for seed in seeds]
    return run_cells(cells, {setting.name: prep}, plan, root, print, jobs)


def table(rows: list[dict]) -> str:
    out = [[r["cond"], str(r["seed"]), r["outcome"], fixed(r["mi"]), fixed(r["strategy_mi"]),
            f"{fixed(r['nll_token_mean'])} ({fixed(r['base_nll_token_mean'])})",
            f"{fixed(r['l_t0_spread_init'])} -> {fixed(r['l_t0_spread_end'])}", f"{r['wall_s']:.0f}"] for r in rows]
    headers = ["cond", "seed", "eval verdict", "exact MI", "I(z; strategy)", "NLL nats/token (base)",
               "l_t0 spread step 0 -> end", "wall s"]
    return markdown_table(headers, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--conds", default="prefix,memory")
    args = ap.parse_args()
    torch.set_num_threads(1)  # small models on a shared 2-core machine: more threads oversubscribe it
    seeds = tuple(int(s) for s in args.seeds.split(","))
    start = time.perf_counter()
    rows = run(args.out, tuple(args.conds.split(",")), seeds, args.jobs)
    wall = time.perf_counter() - start
    write_table_run(args.out, "memory_pathway", rows, table(rows),
                    f"{len(rows)} cells, {args.jobs} at a time; wall time {wall / 60:.1f} min (`python "
                    f"scripts/memory_pathway.py {args.out} --jobs {args.jobs} --seeds {args.seeds} "
                    f"--conds {args.conds}`).")


if __name__ == "__main__":
    main()
