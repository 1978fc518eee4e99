"""`tokweight experiment --checkpoint CKPT --data DATA --out DIR`: does surprisal-share help on my task?

The user's entangled checkpoint (tokweight or Hugging Face) and dataset (train/val/test splits, e.g.
from `tokweight convert`): the store is extracted once (``inputs``), then a grid of discrete CVAEs with
K = the data's number of labels (or ``k``) over the arms (each weighting, and surprisal-share with each
repair that keeps the decoder whole: lambda < 1, the anchor term) x beta x seed, under one recipe and z
pathway: cells of the synthetic jobs (experiments.cells, the one cell cache), whose records hold
the decode-per-latent control against each example's own reference y. Outputs in DIR: results.md (the
verdict first; ``render``), results.csv (mean ± std over seeds), cells.csv, store_predictions.csv,
profile.csv, mi_and_control.png, own_task_config.json (the resolved config).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tokweight.config_files import preset_config
from tokweight.store.durable import write_json_atomic
from tokweight.report.plots import save_figures
from tokweight.report.tables import fixed
from tokweight.training.config.components import COND_MODES
from tokweight.training.config.components import CVAEConfig, default_cond
from tokweight.experiments.artefacts import Echo, coerce_nested
from tokweight.experiments.cells import CONTROL, STATUSES, Cell, CellBudget, CellPlan, Loss, run_cells
from tokweight.experiments.own_task.inputs import (SETTING, Checkpoint, check_store, dataset, latent_k,
                                                            prepare, read_checkpoint, split_shards)
from tokweight.experiments.own_task.render import plot_arms, render
from tokweight.experiments.recipes import recipe_overrides
from tokweight.experiments.results import GROUP_KEYS, mean_std, seed_stats, write_csv
from tokweight.experiments.sweep import SweepConfig
from tokweight.training.config.components import WEIGHTINGS

SWEEP_BETAS = SweepConfig.betas
"""--sweep beta: the synthetic sweep's grid of betas (its default)."""
LAMBDA = "token_weighted_reconstruction_weight"
"""LossConfig's mixing weight lambda: (1 - lambda) * uniform + lambda * the weighting."""
OWN_METRICS = ("usage_perplexity", *CONTROL)
"""Per-arm numbers besides cells.METRICS: usage perplexity exp H(mean q) (how many latent values the aggregate
posterior spreads over; a discrete latent has no active units) and the control rates."""


@dataclass(frozen=True)
class OwnTaskConfig:
    """The user-task comparison (``quick`` shrinks it); its defaults are the full comparison."""

    checkpoint: str
    """The entangled checkpoint: a tokweight checkpoint or a Hugging Face causal LM directory."""
    data: str
    """Dataset directory with train/, val/ and test/ shards (`tokweight convert` writes them)."""
    out: str
    """Results directory; runs/ (and store/ when ``store`` is None) below it are reused across runs."""
    store: str | None = None
    """A store to extract into and read (new, or holding this checkpoint's fingerprint); None: OUT/store."""
    template: str = "tokweight"
    """The checkpoint's format, as extract's ``--template``: "tokweight", "chat" or a string template file."""
    k: int | None = None
    """Values of the discrete latent; None: the data's number of strategy labels (resolved by ``run``)."""
    weightings: tuple[str, ...] = ("uniform", "sum", "surprisal-share")
    """Weightings compared at lambda = 1."""
    mix_lambdas: tuple[float, ...] = ()
    """lambda < 1 of extra surprisal-share arms, which keep the decoder's z-free tokens in the objective (at
    lambda = 1 they have almost none; README, Training): (1 - lambda) uniform weight keeps them trained. None by
    default: the anchor term of the default configuration keeps the decoder whole at lambda = 1."""
    anchors: tuple[tuple[float, float], ...] = ()
    """(weight, margin nats) of extra surprisal-share arms with another anchor term than the default's."""
    betas: tuple[float, ...] = (0.3, 1.0)
    """KL weights (sorted on use)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of every cell."""
    recipe: str = "default"
    """A recipe (tokweight/presets/recipes/) every cell trains with; "default": `tokweight train`'s."""
    cond: str = default_cond("discrete")
    """z pathway of every cell, one of training.cvae.conditioning.MODES: train's for a discrete latent."""
    slots: int = CVAEConfig(cond="prefix").slots
    """Latent slots of the prefix pathway (the others have one): train's."""
    budget: CellBudget = field(default_factory=CellBudget)
    """Per cell: steps, starts, batch, learning rate, beta warm-up (train's) and decoded examples."""
    jobs: int = 1
    """Cells trained at once, each in its own process with one torch thread (no effect on any number)."""

    def __post_init__(self):
        coerce_nested(self, budget=CellBudget)
        for name in ("weightings", "mix_lambdas", "seeds"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "anchors", tuple(tuple(a) for a in self.anchors))  # read back from JSON: lists
        object.__setattr__(self, "betas", tuple(sorted(float(b) for b in self.betas)))
        if [w for w in self.weightings if w not in WEIGHTINGS] or self.cond not in COND_MODES:
            raise ValueError(f"weightings must be in {sorted(WEIGHTINGS)} and cond in {COND_MODES}, got "
                             f"{self.weightings} and {self.cond!r}")
        if not self.weightings or not self.betas or not self.seeds or any(b < 0 for b in self.betas):
            raise ValueError("weightings, betas and seeds must be non-empty and betas >= 0")
        if any(not 0 < lam < 1 for lam in self.mix_lambdas):
            raise ValueError(f"mix_lambdas must lie in (0, 1) (lambda = 1 is the surprisal-share arm), got "
                             f"{self.mix_lambdas}")
        if any(len(a) != 2 or not a[0] > 0 or a[1] < 0 for a in self.anchors):
            raise ValueError(f"anchors must be (weight > 0, margin >= 0) pairs, got {self.anchors}")
        if min(self.slots, self.jobs) < 1 or (self.k is not None and self.k < 2):
            raise ValueError("slots and jobs must be >= 1 and k >= 2")

    @property
    def store_dir(self) -> Path:
        return Path(self.store) if self.store is not None else Path(self.out) / "store"

    @property
    def plan(self) -> CellPlan:
        return CellPlan(self.k, self.slots, self.budget, self.recipe)


def quick(cfg: OwnTaskConfig) -> OwnTaskConfig:
    """--quick: ``cfg`` with the preset experiment/own-quick.toml's fields; every arm and beta."""
    return preset_config(OwnTaskConfig, "experiment", "own-quick", on=cfg)


def sweep_betas(cfg: OwnTaskConfig) -> OwnTaskConfig:
    """--sweep beta: the sweep's log grid of betas, so that the measured beta_c has a grid to fall in."""
    return replace(cfg, betas=SWEEP_BETAS)


def arms(cfg: OwnTaskConfig) -> list[tuple[str, str, Loss]]:
    """(name, weighting, LossConfig fields) of every compared objective: each weighting as it is, then
    surprisal-share with each repair."""
    mixed = [(f"surprisal-share λ={lam:g}", ((LAMBDA, lam),)) for lam in cfg.mix_lambdas]
    # The anchor acts once beta is warm: from step 0 it pulled h0-n16's decoder back to the base before the
    # E-step could use t0's asymmetry, and z was lost at beta 1 (docs/history/results/from-scratch/README.md).
    start = cfg.budget.beta_warmup_steps
    anchored = [(f"surprisal-share anchor {w:g}/{m:g}", (("anchor_weight", w), ("anchor_margin", m),
                                                        ("anchor_start_step", start))) for w, m in cfg.anchors]
    return [(w, w, ()) for w in cfg.weightings] + [(name, "surprisal-share", loss) for name, loss in mixed + anchored]


def own_cells(cfg: OwnTaskConfig) -> list[Cell]:
    return [Cell(SETTING, "discrete", cfg.cond, w, beta, seed, SETTING, name, loss) for beta in cfg.betas
            for name, w, loss in arms(cfg) for seed in cfg.seeds]


def cell_line(cell: Cell, record: dict) -> str:
    """A cell's progress line: its MI, KL, the control against the references (and chance), its NLL."""
    return (f"{cell.arm} beta={cell.beta:g} seed={cell.seed}: MI {fixed(record['mi'])} KL {fixed(record['kl'])} "
            f"exact match {fixed(record['exact_match'])} (chance {fixed(record['chance_exact_match'])}) first token "
            f"{fixed(record['first_token_match'])} (chance {fixed(record['chance_first_token_match'])}) "
            f"NLL {fixed(record['recon_uniform'])}")


def resolve(cfg: OwnTaskConfig):
    """(cfg with K resolved, the checkpoint): every check that needs no work done, before DIR is made."""
    ckpt = read_checkpoint(cfg.checkpoint, cfg.template)
    split_shards(dataset(cfg.data))
    if cfg.store is not None:
        check_store(Path(cfg.store), ckpt.fingerprint, cfg.checkpoint)
    recipe_overrides(cfg.recipe)  # an unknown recipe: no work
    return replace(cfg, k=latent_k(dataset(cfg.data), cfg.k)), ckpt


def run(cfg: OwnTaskConfig, echo: Echo = print, command: str | None = None) -> dict:
    """Check the inputs, extract the store if needed, run every cell, write the results; returns the tables."""
    start = time.perf_counter()
    cfg, ckpt = resolve(cfg)
    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / "own_task_config.json", {"config": asdict(cfg), "checkpoint": asdict(ckpt),
                                                      "recipe_overrides": recipe_overrides(cfg.recipe)})
    cells = own_cells(cfg)
    echo(f"[experiment] own task: K = {cfg.k}, {len(cells)} cells of {cfg.budget.steps} steps, recipe {cfg.recipe}, "
         f"z pathway {cfg.cond}, {cfg.jobs} at a time")
    prep = prepare(ckpt, dataset(cfg.data), cfg.store_dir, echo)
    rows = run_cells(cells, {SETTING: prep}, cfg.plan, root, echo, cfg.jobs, cell_line)
    agg = aggregate_arms(rows)
    wall = time.perf_counter() - start
    write_outputs(root, cfg, prep, rows, agg)
    (root / "results.md").write_text(render(view(cfg, ckpt, prep.data_key), prep.stats, agg, command, wall,
                                            len(rows), sum(r["reused"] for r in rows)))
    echo(f"[experiment] done in {wall / 60:.1f} min: {root / 'results.md'}")
    return {"results": agg, "cells": rows, "stats": prep.stats, "k": cfg.k, "wall_s": wall}


def write_outputs(root: Path, cfg: OwnTaskConfig, prep, rows: list[dict], agg: list[dict]) -> None:
    stats = {k: v for k, v in prep.stats.items() if not isinstance(v, (list, dict))}
    stats |= {f"beta_c_predicted_{w}": b for w, b in prep.stats["beta_c_predicted"].items()}
    write_csv(root / "cells.csv", rows)
    write_csv(root / "results.csv", agg)
    write_csv(root / "store_predictions.csv", [{"fingerprint": prep.fingerprint, "data_key": prep.data_key, **stats}])
    write_csv(root / "profile.csv", prep.stats["profile"])
    save_figures({"mi_and_control.png": plot_arms(agg, cfg.k)}, root)


def view(cfg: OwnTaskConfig, ckpt: Checkpoint, data_key: str) -> dict:
    """What results.md reads of the job: its config as a dict, the checkpoint's and the data's key."""
    return asdict(cfg) | {"ckpt": asdict(ckpt), "data_key": data_key}


# ---------------------------------------------------------------- per arm


def aggregate_arms(rows: list[dict]) -> list[dict]:
    """One row per (arm, beta) in first-seen order: mean and std over seeds of every metric, and how many
    seeds eval's verdict says use z."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["beta"]), []).append(r)
    return [arm_stats(arm, rs) for (arm, _), rs in groups.items()]


def arm_stats(arm: str, rows: list[dict]) -> dict:
    out = {"arm": arm, "lambda": rows[0].get(LAMBDA, 1.0), **seed_stats({k: rows[0][k] for k in GROUP_KEYS}, rows)}
    for m in OWN_METRICS:
        out[f"{m}_mean"], out[f"{m}_std"] = mean_std([r.get(m) for r in rows])
    return out | {"seeds_z_used": sum(bool(r.get("z_used")) for r in rows),
                  **{f"seeds {status}": sum(r.get("status") == status for r in rows) for status in STATUSES}}
