"""How far the prefix's latent rows start from the checkpoint's mean latent row: the default recipe with its
offset norm (RemedyConfig.latent_embedding_norm) varied, on the demo's data and budget (h0-n16, 4 slots,
surprisal-share, beta 0.3, 300 steps), one row per norm and seed: eval's verdict, exact MI, I(z; strategy),
the decoder's token-mean NLL at step 0 (what the rows' init costs it) and at the end against the base's, and
the decoder's response to z at the most surprising token (l_t0 spread) at step 0 and at the end.

    python scripts/latent_row_norm.py OUT [--norms 1,0.5,0.3] [--seeds 0,1,2] [--jobs 2]

Writes OUT/ (data, base model, store, runs; reused when their keys match), OUT/cells.csv and
OUT/latent_row_norm.md, and prints the table.
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
SLOTS = 4  # the default's (CVAEConfig.slots)


def run(root: Path, norms: tuple[float, ...], seeds: tuple[int, ...], jobs: int) -> list[dict]:
    task = DEMO.task
    setting = task.settings[0]
    prep = prepare_setting(task, setting, root, print)
    plan = CellPlan(task.k, SLOTS, CellBudget(steps=DEMO.cvae_steps, decode_examples=DEMO.decode_examples), "default")
    cells = [Cell(setting.name, "discrete", "prefix", WEIGHTING, BETA, seed, group="rows",
                  remedies=(("latent_embedding_norm", norm),)) for norm in norms for seed in seeds]
    return run_cells(cells, {setting.name: prep}, plan, root, print, jobs)


def table(rows: list[dict]) -> str:
    out = [[f"{r['latent_embedding_norm']:g}", str(r["seed"]), r["outcome"], fixed(r["mi"]), fixed(r["strategy_mi"]),
            fixed(r["nll_init"]), f"{fixed(r['nll_token_mean'])} ({fixed(r['base_nll_token_mean'])})",
            f"{fixed(r['l_t0_spread_init'])} -> {fixed(r['l_t0_spread_end'])}", f"{r['wall_s']:.0f}"] for r in rows]
    headers = ["offset norm", "seed", "eval verdict", "exact MI", "I(z; strategy)", "NLL at step 0",
               "NLL nats/token at the end (base)", "l_t0 spread step 0 -> end", "wall s"]
    return markdown_table(headers, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--norms", default="1,0.5,0.3")
    args = ap.parse_args()
    torch.set_num_threads(1)  # small models on a shared 2-core machine: more threads oversubscribe it
    seeds = tuple(int(s) for s in args.seeds.split(","))
    start = time.perf_counter()
    rows = run(args.out, tuple(float(n) for n in args.norms.split(",")), seeds, args.jobs)
    wall = time.perf_counter() - start
    write_table_run(args.out, "latent_row_norm", rows, table(rows),
                    f"{len(rows)} cells, {args.jobs} at a time; wall time {wall / 60:.1f} min (`python "
                    f"scripts/latent_row_norm.py {args.out} --jobs {args.jobs} --seeds {args.seeds} "
                    f"--norms {args.norms}`).")


if __name__ == "__main__":
    main()
