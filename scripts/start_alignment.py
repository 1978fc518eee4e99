"""Step 0 of a run: how far apart the latent values start, and whether that difference already follows the strategy.

For each seed, the CVAE as `tokweight train` builds it from RUN's config (its checkpoint, data and store; the seed
and, with --cond, the z pathway replaced) before its first step: over a few training batches, each example's
reconstruction R(k) under every value k, with uniform and with surprisal-share token weights (mixed with uniform as
the run's ``loss.token_weighted_reconstruction_weight`` says). Printed per seed and weighting: the mean range
max_k R(k) - min_k R(k) (nats), and I(argmin_k R; strategy) (nats; at most log min(K, S)). Under the default E-step
(soft, its temperature the step's beta, no balancing, no labelled examples) beta is near 0 in the warm-up, so argmin_k
R is the value each example trains; under other E-step settings it is only the value that reconstructs it best.
A discrete latent only (a continuous one's copies are draws, not values). Float32, as on a CPU.

    python scripts/start_alignment.py RUN --cond query --seeds 0-8 --batches 8
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

WEIGHTINGS = ("uniform", "surprisal-share")


def alignment(R: np.ndarray, strategies: list[str], k: int) -> tuple[float, float]:
    """R (N, K) reconstructions, the N examples' strategies -> (mean range of R over the values, I(argmin R;
    strategy) in nats)."""
    from tokweight.training.evaluation.metrics import contingency, contingency_mi

    table, _ = contingency(strategies, R.argmin(1), k)
    return float((R.max(1) - R.min(1)).mean()), contingency_mi(table)


def step_zero(run: Path, seed: int, cond: str | None, batches: int) -> dict[str, np.ndarray]:
    """weighting -> (N, K) R(k) of the first ``batches`` training batches at step 0, and "strategies"."""
    from tokweight.pipeline.ranks import Ranks
    from tokweight.training.objective.terms import reconstruction_weights, weighted_reconstruction
    from tokweight.training.loop.run_dir import read_config
    from tokweight.training.loop.step import sample_generator
    from tokweight.training.loop.stream import TrainStream
    from tokweight.training.loop.setup import setup

    cfg = read_config(run)
    if cfg.cvae.latent != "discrete":
        raise SystemExit(f"{run}: a continuous latent's copies are draws of z, not values: use a discrete run")
    cvae = cfg.cvae if cond is None else replace(cfg.cvae, cond=cond, slots=None)
    scratch = tempfile.TemporaryDirectory()
    cfg = replace(cfg, cvae=cvae, optim=replace(cfg.optim, seed=seed), io=replace(cfg.io, out=scratch.name))
    ranks = Ranks(timeout_s=60.0, backend="gloo")
    try:
        state = setup(cfg, ranks, announce=False)
        stream = TrainStream(state.spec, 0, 1).batches(0)
        R, strategies = {w: [] for w in WEIGHTINGS}, []
        with torch.no_grad():
            for _ in range(batches):
                batch = next(stream).to(state.device)
                out = state.engine(batch, generator=sample_generator(seed, 0), global_batch=state.global_batch)
                b = state.baseline(batch, out)
                for w in WEIGHTINGS:
                    pi, _ = reconstruction_weights(w, b, batch.zfree.mask, state.params,
                                                   cfg.loss.token_weighted_reconstruction_weight)
                    R[w].append(weighted_reconstruction(out.nll, pi.to(out.nll.dtype)).double().cpu().numpy())
                strategies += list(batch.strategies)
    finally:
        ranks.close()
        scratch.cleanup()
    return {**{w: np.concatenate(R[w]) for w in WEIGHTINGS}, "strategies": strategies, "k": cfg.cvae.k}


def seeds_arg(text: str) -> list[int]:
    if "-" in text:
        first, last = map(int, text.split("-"))
        return list(range(first, last + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory: its config.json names the checkpoint, data and store")
    ap.add_argument("--cond", default=None, help="z pathway (default: the run's)")
    ap.add_argument("--seeds", type=seeds_arg, default=[0, 1, 2], help="e.g. 0-8 or 0,3,6 (a job's starts are "
                    "seeds s*N .. s*N+N-1)")
    ap.add_argument("--batches", type=int, default=8, help="training batches read (the run's batch size)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"run": str(args.run), "cond": args.cond, "batches": args.batches}))
    for seed in args.seeds:
        made = step_zero(args.run, seed, args.cond, args.batches)
        cells = [f"{w}: R range {r:.3f}, I(argmin R; strategy) {i:.3f}"
                 for w in WEIGHTINGS for r, i in [alignment(made[w], made["strategies"], made["k"])]]
        print(f"seed {seed} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
