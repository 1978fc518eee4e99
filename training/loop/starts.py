"""Several starts: train each initialisation a round at a time, compare them once a code has formed, go on from one.

A run's code is set in its first few hundred steps, so ``optim.starts`` seeds are
each trained ``start_steps`` in their own run directory (RUN/starts/seed-S/, resumable like any run) and validated
on the whole val split. While no start's code has formed but one is forming (``another_round``), every start goes
on by ``start_steps`` more, up to ``start_steps_max`` and below the cap. Then the start with the least validation
objective E_q[R] + beta KL (what the run minimises, and what its stop rule reads) is kept, and the run goes on from
it: among codes, the one that reconstructs the tokens that decide the strategy best (a merge reconstructs them
worse, at about the same KL); between a code and a start that has none, the one the objective prefers, so a z
whose gain is below its cost (past the weighting's beta_c) is not kept because one start happened to find it. A
start continued is the run from its seed, so the job ends bitwise where a single run from the kept seed ends, with
its hardening from the same step (``continued``).

RUN/starts.json records each round and, once made, the choice; a job run again resumes from its last round and
keeps a choice made. How one start trains is the caller's (``train.train_start``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from tokweight.pipeline.ranks import Ranks
from tokweight.store.durable import write_json_atomic
from tokweight.training.loop.convergence import val_objective
from tokweight.training.config.use import kept_threshold
from tokweight.training.loop.run_dir import committed_checkpoint
from tokweight.training.config.train import TrainConfig, harden_from

TrainStart = Callable[[int, int, bool], dict]
"""(seed, until, announce) -> the start's metrics on the whole val split ("recon", "kl", "mi"), trained to step
``until``; ``announce``: whether it says what trains (the job's first start only)."""


def seeded(cfg: TrainConfig, seed: int) -> TrainConfig:
    return replace(cfg, optim=replace(cfg.optim, seed=seed))


def continued(cfg: TrainConfig, made: dict) -> TrainConfig:
    """The run that goes on from the kept start: its seed and, unless the config sets another, the E-step's
    hardening from the step the starts were compared at, where the code is chosen (``config.train.harden_from``)."""
    chosen = seeded(cfg, made["seed"])
    return replace(chosen, estep=replace(chosen.estep, harden_from=harden_from(chosen.estep, chosen.optim,
                                                                               made["compared_at"])))


def start_dir(cfg: TrainConfig, seed: int) -> Path:
    return Path(cfg.io.out) / "starts" / f"seed-{seed}"


def compare_starts(cfg: TrainConfig, ranks: Ranks, train_start: TrainStart) -> dict:
    """The starts trained round by round and compared (the module's docstring); RUN/starts.json's content, the same
    on every rank: "seeds", "start_steps", "start_steps_max", "rounds" (per round "steps", "val_recon", "val_mi",
    "val_objective"), "compared_at" and the chosen "seed"."""
    out, optim = Path(cfg.io.out), cfg.optim
    seeds = [optim.seed * optim.starts + i for i in range(optim.starts)]
    plan = {"seeds": seeds, "start_steps": optim.start_steps, "start_steps_max": optim.start_steps_max}
    made = read_starts(out)
    before_rounds = {"start_steps_max": optim.start_steps_max}  # a choice made before there were rounds stands
    same = all((before_rounds | made).get(k) == v for k, v in plan.items())
    if same and "seed" in made:
        return made
    if (committed_checkpoint(out) / "state.json").is_file():
        raise ValueError(f"{out} holds a run trained without these starts ({optim.starts} of "
                         f"{optim.start_steps} steps from seed {optim.seed}); use a new --out")
    rounds, last = (made.get("rounds", []) if same else []), min(optim.start_steps_max, optim.steps - 1)
    announce = True
    while not rounds or ranks.broadcast(another_round(rounds, cfg, last)):  # rank 0's decision: ranks in step
        until = rounds[-1]["steps"] + optim.start_steps if rounds else optim.start_steps
        val = [train_start(seed, until, announce and i == 0) for i, seed in enumerate(seeds)]
        announce = False
        rounds.append({"steps": until, "val_recon": [v["recon"] for v in val], "val_mi": [v.get("mi") for v in val],
                       "val_objective": [val_objective(v, cfg.loss.beta) for v in val]})
        write_starts(out, ranks, plan | {"rounds": rounds})
    made = plan | {"rounds": rounds, "compared_at": rounds[-1]["steps"],
                   "seed": seeds[int(np.argmin(compared(rounds[-1], cfg)))]}
    write_starts(out, ranks, made)
    return ranks.broadcast(made)


def compared(round_: dict, cfg: TrainConfig) -> list[float]:
    """A round's starts as they are compared: the validation objective E_q[R] + beta KL at the run's beta."""
    if "val_objective" not in round_:
        raise ValueError(f"{cfg.io.out}/starts.json holds rounds from before the starts were compared by the "
                         "objective; use a new --out")
    return round_["val_objective"]


def another_round(rounds: list[dict], cfg: TrainConfig, last: int) -> bool:
    """Whether the starts train ``start_steps`` more before they are compared: no start's code has formed yet
    (``code_formed``), the best start's exact MI rose over the last round (from 0 before the first) by more than the
    stop rule's ``min_delta_mi``, as the stop rule counts a rise (a z that is not being found, uniform's or past
    beta_c, is compared at once), and the round ends by ``last``."""
    if code_formed(rounds[-1]["val_mi"], cfg) or rounds[-1]["steps"] + cfg.optim.start_steps > last:
        return False
    before = max(rounds[-2]["val_mi"]) if len(rounds) > 1 else 0.0
    return max(rounds[-1]["val_mi"]) - before > cfg.optim.stop.min_delta_mi


def code_formed(val_mi: list[float | None], cfg: TrainConfig) -> bool:
    """Whether some start's code has formed: its exact MI on the val split at least ``kept_threshold(K)`` (a
    discrete latent; a continuous one is compared as it is)."""
    return cfg.cvae.latent != "discrete" or max(val_mi) >= kept_threshold(cfg.cvae.k)


def read_starts(out: Path) -> dict:
    """RUN/starts.json: the rounds so far and, once made, the choice ("seed"); {} before the first round."""
    return json.loads((out / "starts.json").read_text()) if (out / "starts.json").is_file() else {}


def write_starts(out: Path, ranks: Ranks, made: dict) -> None:
    """RUN/starts.json, atomically: a job killed while writing it finds the last round's."""
    if ranks.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "starts.json", made)
