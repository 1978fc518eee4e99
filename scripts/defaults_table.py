"""The table the training defaults were chosen from: `tokweight train`'s default configuration with its
own weighting (surprisal-share) against uniform, on the synthetic settings at K = 2 and K = 4 and with an
imperfect base model (stopped early, so b after t0 is above 0.1 nats), 3 seeds, each cell judged by
eval's verdict (z used with the decoder whole / damaged, z not used).

    python scripts/defaults_table.py OUT [--jobs 2] [--seeds 0,1,2]

The imperfect-base sweep runs the K = 2 task over base models trained 400-2200 steps (b after t0 from
about 0.05 to 0.4 nats) with the weightings that differ in how they treat a floor of surprisal:

    python scripts/defaults_table.py OUT --blocks k2-base2200,k2,k2-base1000,k2-base700,k2-base400 \
        --weightings uniform,sum,surprisal-share,excess-share --cap 300

Four and eight strategies at T/(t0+1) of about 8 or more (the default preset's x of 12-16 symbols; K = 8
adds rotate-right, swap-pairs and evens-odds), where eval also reports how many strategies an input's K
decodes cover and whether a latent value means one strategy across inputs:

    python scripts/defaults_table.py OUT --blocks k4-long,k8-long --cap 1500

The same K = 4 and K = 8 tasks with `train-base --preset default`'s base, which executes the strategies:

    python scripts/defaults_table.py OUT --blocks k4-default --cap 1500
    python scripts/defaults_table.py OUT --blocks k8-default --weightings surprisal-share,uniform --cap 600

and with that base trained twice as long, on the preset's 20,000 examples or on 384,000 seen once each
(blocks k8-default-base6000, k8-default-data384k).

What the merge of two strategies into two shared latent values at K = 4 responds to, one field on
top of the default per invocation (``estep.FIELD`` for the E-step's); the learned prior inside the E-step
against the default uniform one:

    python scripts/defaults_table.py OUT --blocks k4-default --weightings surprisal-share --cap 600 \
        --seeds 2,0,1 --set estep.prior=learned

(``loss.FIELD`` for a field of the loss, e.g. the anchor term from step 0 on single starts of seeds 3-8:
``--blocks k4-default-baseseed1 --weightings surprisal-share --cap 600 --seeds 3,4,5,6,7,8 --starts 1
--set loss.anchor_start_step=0``), and to the base model's own seed (blocks k4-default-baseseed1,
k4-default-baseseed2: the same recipe, another draw), to the number of starts compared after 400 steps
(``--starts 1``: one initialisation), and to more latent slots, on a base that read the
template at 1-8 slots (4 and 8 compared on it):

    python scripts/defaults_table.py OUT --blocks k4-default-slots8 --weightings surprisal-share --cap 600 \
        --seeds 2,0,1 --slots 8

Two strategies that begin alike and part at the second token (copy and evens-odds, K = 2), the decision that
no latent value made at K = 8:

    python scripts/defaults_table.py OUT --blocks k2-copy-evens-odds --cap 300

Strategies of unequal frequency (copy 0.8, rotate-left 0.2; k2-imbalanced-60: 0.6 and 0.4), under the default
(no balance over the batch) and with the E-step's Sinkhorn balance:

    python scripts/defaults_table.py OUT --blocks k2-imbalanced --cap 300
    python scripts/defaults_table.py OUT --blocks k2-imbalanced --cap 300 --set estep.balance_iters=3

The longest dilution, T/(t0+1) about 64 (x of 64 symbols, K = 2), with a base trained the usual way and
one trained on the z-conditioned template at 4 slots only (`train-base --min-slots 4`):

    python scripts/defaults_table.py OUT --blocks k2-n64,k2-n64-slots4 --weightings uniform,surprisal-share --cap 300 \
        --cond prefix

and the same ratio with x of 16 symbols and y = s(x) followed by a fixed ending of 48 filler tokens, on a
base trained 1500 steps (which has not learnt the copy) and one trained 4000 (`--cond` for the other pathways):

    python scripts/defaults_table.py OUT --blocks k2-trailer48-base1500 --weightings uniform,sum,surprisal-share \
        --cap 300
    python scripts/defaults_table.py OUT --blocks k2-trailer48 --weightings uniform,sum,surprisal-share --cap 1500

Tasks whose strategies write different things (pipeline.data.synth_kinds: one content in K invented languages, one
record in K file formats, numbers written by K procedures), each kind's preset at K = 4 and K = 8 with
`train-base --preset default`'s base:

    python scripts/defaults_table.py OUT --blocks lexical-k4,format-k4,procedure-k4 --seeds 0,1,2
    python scripts/defaults_table.py OUT --blocks lexical-k8,format-k8,procedure-k8 --seeds 0,1,2

Writes OUT/<block>/ (data, base models, stores, runs; reused when their keys match), OUT/cells.csv and
OUT/defaults_table.md, and prints the table. The walk-through on converted JSON lines is the user path
of the same K = 4 task: `tokweight experiment --checkpoint ... --data ...` (README, "Your own data").
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from tokweight.pipeline.data.config import DEFAULT_STRATEGIES, SynthConfig
from tokweight.pipeline.data.synth import STRATEGIES, kind_strategies
from tokweight.report.tables import markdown_table
from tokweight.training.config.use import OUTCOMES
from tokweight.experiments.artefacts import Setting, TaskConfig, base_model, prepare_setting, synthetic_task
from tokweight.config_files import assignment, preset, preset_config
from tokweight.experiments.cells import CELL_LOSS_FIELDS, Cell, CellBudget, CellPlan, Overrides, run_cells
from tokweight.experiments.recipes import with_recipe
from tokweight.experiments.results import write_table_run
from tokweight.training.config.components import CVAEConfig, default_cond
from tokweight.training.config.train import IOConfig, OptimConfig, TrainConfig

WEIGHTINGS = ("uniform", "surprisal-share")
BETA = 0.3  # the default's beta (LossConfig.beta)
H0 = Setting("h0-n16", 0, 16, 16)
LONG = Setting("n12-16", 0, 12, 16)  # the default preset's x: T/(t0+1) about 8-12
H0_N64 = Setting("h0-n64", 0, 64, 64)  # one decision among 65 supervised tokens
H0_N16_T48 = Setting("h0-n16-t48", 0, 16, 16, trailer_len=48)  # the same, the last 48 a fixed ending
SMALL = preset_config(SynthConfig, "synth", "small")
DEFAULT_SYNTH = preset_config(SynthConfig, "synth", "default")
DEFAULT_BASE = {k: v for k, v in preset("base", "default").items() if k != "eval_every"}  # base_model sets it
ALL_STRATEGIES = tuple(STRATEGIES)
SYNTHETIC = synthetic_task()
"""The experiments' task (presets/experiment/task.toml): its generator is every block's but the long ones' and
k4's."""


def k2_task(setting: Setting, base, **synth) -> TaskConfig:
    """The experiments' generator (with the fields ``synth`` changes) on one setting, with a base trained by
    ``base``."""
    return TaskConfig(settings=(setting,), synth=replace(SYNTHETIC.synth, **synth), base=base)


def long_task(names: tuple[str, ...], base, n_train: int = DEFAULT_SYNTH.n_train) -> tuple[TaskConfig, Setting]:
    """The default preset's x (12-16 symbols) under the strategies ``names``, with a base trained by ``base`` on
    ``n_train`` examples."""
    synth = replace(DEFAULT_SYNTH, strategies=names, n_train=n_train)
    return TaskConfig(settings=(LONG,), synth=synth, base=base), LONG


def kind_task(kind: str, k: int) -> tuple[TaskConfig, Setting]:
    """The preset of ``kind`` (presets/synth/<kind>.toml) with its first k strategies, on
    `train-base --preset default`'s base."""
    synth = preset_config(SynthConfig, "synth", kind, strategies=list(kind_strategies(kind)[:k]))
    setting = Setting(f"{kind}-k{k}", 0, synth.min_len, synth.max_len)
    return TaskConfig(settings=(setting,), synth=synth, base=base_model(**DEFAULT_BASE)), setting


BLOCKS = {  # name -> (task, setting): the data and the base model of each row group
    "k2": (k2_task(H0, base_model(1500)), H0),
    "k2-imperfect": (k2_task(H0, base_model(900)), H0),
    **{f"k2-base{steps}": (k2_task(H0, base_model(steps)), H0) for steps in (400, 700, 1000, 2200)},
    **{f"k{len(names)}-long": long_task(names, base_model(3000, lr=2e-3))
       for names in (DEFAULT_STRATEGIES, ALL_STRATEGIES)},
    # the same tasks with `train-base --preset default`'s base (3 layers, d 128: 0.025 nats after t0 at K = 4),
    # one that executes every strategy
    **{f"k{len(names)}-default": long_task(names, base_model(**DEFAULT_BASE))
       for names in (DEFAULT_STRATEGIES, ALL_STRATEGIES)},
    # the 8 strategies leave that base 0.30 nats after t0 at 3000 steps: the same model trained twice as long
    "k8-default-base6000": long_task(ALL_STRATEGIES, base_model(**{**DEFAULT_BASE, "steps": 6000})),
    # which memorises the preset's 20,000 examples (training NLL half its validation NLL): 6000 steps of 64 on
    # 384,000, each example seen once
    "k8-default-data384k": long_task(ALL_STRATEGIES, base_model(**{**DEFAULT_BASE, "steps": 6000}), 384_000),
    # its base reads the z-conditioned template at 3.19 nats per token (2.49 at 3000 steps): docs/results.md
    "k2-n64": (k2_task(H0_N64, base_model(1500)), H0_N64),
    # the same with a base trained on the z-conditioned template at the CVAE's 4 slots only
    "k2-n64-slots4": (k2_task(H0_N64, base_model(3000, min_slots=4)), H0_N64),
    # neither base leaves under 0.02 nats after t0 on 64 symbols: x of 16 and y = s(x) + 48 fillers, which
    # a base predicts near-perfectly. At k2's 1500 steps the base has learnt the fillers and not the copy
    # (2.3 nats on each of s(x)'s tokens); 4000 steps leave 0.019 after t0
    **{f"k2-trailer48{suffix}": (k2_task(H0_N16_T48, base_model(steps)), H0_N16_T48)
       for suffix, steps in (("-base1500", 1500), ("", 4000))},
    # the K = 4 default block with a base that also reads the template at 5-8 slots, for --slots 8
    "k4-default-slots8": long_task(DEFAULT_STRATEGIES, base_model(**{**DEFAULT_BASE, "max_slots": 8})),
    # the K = 4 default block's base recipe under other seeds: how much of the K = 4 result is the base's draw
    **{f"k4-default-baseseed{seed}": long_task(DEFAULT_STRATEGIES, base_model(**{**DEFAULT_BASE, "seed": seed}))
       for seed in (1, 2)},
    # K = 2 with two strategies that begin alike (x[0]) and part at the second token, as three pairs do at K = 8.
    # At 1500 steps the base reproduces 1% of the references (b after t0 0.41); 4000 as for the trailer
    **{f"k2-copy-evens-odds{suffix}": (k2_task(H0, base_model(steps), strategies=("copy", "evens-odds")), H0)
       for suffix, steps in (("-base1500", 1500), ("", 4000))},
    # the k2 task with strategies of unequal frequency (copy 0.8 or 0.6, rotate-left the rest): the E-step's
    # Sinkhorn balance gives each latent value a 1/K share of every batch, which a strategy code does not have here
    **{f"k2-imbalanced{suffix}": (k2_task(H0, base_model(1500), prior="weighted", weights=weights), H0)
       for suffix, weights in (("", (0.8, 0.2)), ("-60", (0.6, 0.4)))},
    # strategies that write different things (pipeline.data.synth_kinds), each kind's preset
    **{f"{kind}-k{k}": kind_task(kind, k) for kind in ("lexical", "format", "procedure") for k in (4, 8)},
    "k4": (TaskConfig(settings=(Setting("k4-n6-9", 0, SMALL.min_len, SMALL.max_len),),
                      synth=replace(SMALL, header_len=0), base=base_model(3000, lr=2e-3)),
           Setting("k4-n6-9", 0, SMALL.min_len, SMALL.max_len)),
}


def cell_overrides(specs: list[str], latent: str) -> Overrides:
    """``--set GROUP.FIELD=VALUE`` options as a cell's dotted TrainConfig overrides over the default's (the value
    a TOML literal or else a string, as `tokweight train --set` reads it), checked on a probe config here rather
    than in a worker process; the loss fields each cell sets itself are refused."""
    try:
        overrides = dict(assignment(spec) for spec in specs)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if clash := sorted(k for k in overrides if k.removeprefix("loss.") in CELL_LOSS_FIELDS and k.startswith("loss.")):
        raise SystemExit(f"--set {clash[0]}: the table sets the loss's {', '.join(CELL_LOSS_FIELDS)} itself "
                         "(use --weightings; beta is the default's)")
    probe = TrainConfig(IOConfig(checkpoint="c", data="d", out="o", store="s"), cvae=CVAEConfig(latent=latent))
    try:
        with_recipe(probe, "default", overrides)
    except ValueError as e:
        raise SystemExit(f"--set {' '.join(specs)}: {e}") from None
    return tuple(overrides.items())


def run_block(name: str, root: Path, seeds: tuple[int, ...], weightings: tuple[str, ...], cond: str, latent: str,
              jobs: int, cap: int, remedy: tuple[str, ...] = (), slots: int | None = None,
              starts: int | None = OptimConfig.starts, echo=print) -> list[dict]:
    task, setting = BLOCKS[name]
    prep = prepare_setting(task, setting, root / name, echo)
    plan = CellPlan(task.k, slots, CellBudget(steps=cap, starts=starts, decode_examples=256), "default")
    overrides = cell_overrides(list(remedy), latent)
    cells = [Cell(setting.name, latent, cond, w, BETA, s, group="grid" if latent == "discrete" else "continuous",
                  overrides=overrides) for w in weightings for s in seeds]
    rows = run_cells(cells, {setting.name: prep}, plan, root / name, echo, jobs)
    return [{"block": name, "cond": cond, "latent": latent, "k": task.k, "b_after_t0": prep.stats["base_b_after_t0"],
             **r, "remedy": " ".join(remedy),
             "slots": "" if slots is None else f"{slots} slots",
             "starts": "" if starts == OptimConfig.starts else f"{starts} start{'s' if starts > 1 else ''}"}
            for r in rows]


def table(rows: list[dict]) -> str:
    out = []
    for (block, weighting), group in group_by(rows, ("block", "weighting")).items():
        count = Counter(r["outcome"] for r in group)

        def ms(metric: str) -> str:
            values = np.array([r[metric] for r in group if r.get(metric) is not None], dtype=float)
            return "n/a" if not len(values) else f"{values.mean():.3f} ± {values.std():.3f}"

        first = group[0]
        stops = Counter(r.get("stop") or "cap" for r in group)
        label = ", ".join([block] + [first[k] for k in ("cond", "slots", "starts", "latent", "remedy")
                                     if first.get(k) not in (None, "", default_cond(first["latent"]), "discrete")])
        out.append([label, str(first["k"]), f"{first['ratio_true']:.1f}", f"{first['b_after_t0']:.3f}", weighting,
                    " / ".join(str(count.get(o, 0)) for o in OUTCOMES),
                    ", ".join(f"{n} {reason}" for reason, n in sorted(stops.items())), ms("mi"), ms("strategy_mi"),
                    ms("coverage"), ms("decode_strategy_mi"), ms("values_one_strategy"), ms("control_accuracy"),
                    f"{ms('own_exact_match')} ({ms('base_exact_match')})",
                    f"{ms('nll_token_mean')} ({ms('base_nll_token_mean')})"])
    headers = ["block", "K", "T/(t0+1)", "base b after t0", "weighting", "seeds whole / damaged / z not used",
               "stopped", "exact MI", "I(z; strategy)", "strategies covered by an input's K decodes",
               "I(value; strategy) over valid decodes", "values naming one strategy",
               "control accuracy", "exact match (base)", "NLL nats/token (base)"]
    return markdown_table(headers, out)


def group_by(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--blocks", default="k2,k2-imperfect,k4")
    ap.add_argument("--weightings", default=",".join(WEIGHTINGS))
    ap.add_argument("--cond", default=None, help="z pathway (default: train's for the latent, "
                    "training.config.components.default_cond; the prefix with --slots)")
    ap.add_argument("--latent", default="discrete", choices=("discrete", "continuous"))
    ap.add_argument("--set", dest="remedy", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                    help="a TrainConfig field over the default's, as `tokweight train --set` (repeatable)")
    ap.add_argument("--slots", type=int, default=None, help="latent slots of the prefix pathway (default: "
                    "CVAEConfig's); more than the base's max_slots start from a template it never read")
    ap.add_argument("--starts", type=int, default=OptimConfig.starts, help="initialisations per cell (default: "
                    f"the latent's), compared after {OptimConfig.start_steps} steps (train's --starts)")
    ap.add_argument("--cap", type=int, default=OptimConfig.steps, help="step cap per cell (the stop rule ends most "
                    "runs before it)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # small models on a shared 2-core machine: more threads oversubscribe it
    seeds = tuple(int(s) for s in args.seeds.split(","))
    start = time.perf_counter()
    weightings = tuple(args.weightings.split(","))
    cond = args.cond or ("prefix" if args.slots else default_cond(args.latent))  # slots are the prefix's
    rows = [r for name in args.blocks.split(",") for r in run_block(name, args.out, seeds, weightings, cond,
                                                                    args.latent, args.jobs, args.cap,
                                                                    tuple(args.remedy), args.slots, args.starts)]
    wall = time.perf_counter() - start
    write_table_run(args.out, "defaults_table", rows, table(rows),
                    f"Seeds {list(seeds)}, beta {BETA}, cap {args.cap} steps, {len(rows)} cells; wall time "
                    f"{wall / 60:.1f} min (`python scripts/defaults_table.py {args.out} --jobs {args.jobs} --cap "
                    f"{args.cap} --blocks {args.blocks} --weightings {args.weightings} --cond {cond} "
                    f"--latent {args.latent}{''.join(f' --set {r}' for r in args.remedy)}"
                    f"{'' if args.slots is None else f' --slots {args.slots}'}"
                    f"{'' if args.starts == OptimConfig.starts else f' --starts {args.starts}'}`).")


if __name__ == "__main__":
    main()
