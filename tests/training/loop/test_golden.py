"""Golden per-step losses of short seeded CVAE runs (torchtitan's checked-in expected-loss file).

Each run in ``RUNS`` trains 8 steps on the session's ``tiny`` data, base checkpoint and
baseline store (tests/support/fixtures_train.py), logging every step; the test compares each step's
loss, recon and kl with tests/training/loop/golden/train_losses.json (CPU float32, one torch thread).

A deliberate change of the numbers refreshes the file with

    python -m tests.training.loop.test_golden --write

which runs this same test through pytest (the same fixtures) with the write switch on; the
test and the regeneration share ``golden_numbers``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from tokweight.training.config.migrations import train_config_from
from tokweight.training.loop.run_dir import read_metrics
from tokweight.training.loop.train import run
from tokweight.training.config.train import TrainConfig

GOLDEN = Path(__file__).parent / "golden" / "train_losses.json"
WRITE_ENV = "TOKWEIGHT_GOLDEN_WRITE"
REGENERATE = "python -m tests.training.loop.test_golden --write"
FIELDS = ("loss", "recon", "kl")
RTOL, ATOL = 1e-5, 1e-6

# The runs' fields as TrainConfig.to_json groups them. Fields every run sets (besides the fixture paths
# checkpoint, data, store and out):
COMMON = {"io": {"num_workers": 0, "device": "cpu"}, "loss": {"policy": "precomputed"},
          "optim": {"steps": 8, "batch_size": 8, "seed": 0},
          "log": {"log_every": 1, "grad_diag_every": 0, "ckpt_every": 8, "eval_batch_size": 64}}


def merged(*groups: dict) -> dict:
    """The groups' fields merged group by group (a later dict's field wins)."""
    out: dict = {}
    for g in groups:
        for name, fields in g.items():
            out[name] = {**out.get(name, {}), **fields}
    return out


# The configuration before the defaults became the from-scratch method: one z token, beta 1 from step 0, no
# E-step, the checkpoint's own latent rows, no anchor, lr 1e-3. Spelt out so that the runs recorded under it keep
# their numbers.
PLAIN = {"cvae": {"cond": "token", "posterior_pool": "last", "latent_init_norm": 0.0, "latent_init_center": False},
         "loss": {"beta": 1.0, "beta_warmup_steps": 0, "anchor_weight": 0.0, "anchor_margin": 0.0},
         "estep": {"mode": "off"}, "optim": {"lr": 1e-3}}
# Each run's own fields, JSON-native (train_config_from turns the dicts into their configs).
RUNS: dict[str, dict] = {
    "discrete": merged(PLAIN, {"cvae": {"latent": "discrete", "k": 4}}),
    "continuous": merged(PLAIN, {"cvae": {"latent": "continuous"}}),
    "discrete-estep-hard": merged(PLAIN, {"cvae": {"latent": "discrete", "k": 4, "latent_init_norm": 3.0},
                                          "estep": {"mode": "hard", "balance_iters": 3, "follow_beta": False,
                                                    "prior": "uniform"}}),
    "continuous-example-inverse-free-bits": merged(PLAIN, {"cvae": {"latent": "continuous"},
                                                           "loss": {"weighting": "example-inverse", "free_bits": 0.1}}),
    "default": {},  # TrainConfig's defaults: what `tokweight train` runs
}
PATH_FIELDS = ("checkpoint", "data", "store", "out")


def config(name: str, tiny, store, out: Path) -> TrainConfig:
    data, ckpt = tiny
    paths = {"io": dict(checkpoint=str(ckpt), data=str(data), store=str(store), out=str(out))}
    return train_config_from(merged(paths, COMMON, RUNS[name]))


def resolved(cfg: TrainConfig) -> dict:
    """Every config field but the (temporary) paths: what the run was, defaults included."""
    groups = cfg.to_json()
    groups["io"] = {k: v for k, v in groups["io"].items() if k not in PATH_FIELDS}
    return groups


def golden_numbers(tiny, store, root: Path) -> dict:
    """Train every run of ``RUNS`` under ``root`` on one torch thread; the golden file's content."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {}
        for name in RUNS:
            cfg = config(name, tiny, store, root / name)
            run(cfg)
            steps = [{"step": r["step"], **{f: r[f] for f in FIELDS}} for r in read_metrics(cfg.io.out) if "loss" in r]
            runs[name] = {"overrides": RUNS[name], "config": resolved(cfg), "steps": steps}
    finally:
        torch.set_num_threads(threads)
    return {"regenerate": f"{REGENERATE}  (from the repository root; commit the file with the change)",
            "tolerance": {"rtol": RTOL, "atol": ATOL},
            "fixtures": "tests/support/fixtures_train.py: tiny (synth preset 'tiny', seed 0; 30-step base) and tiny_store",
            "generated_from": {"commit": _commit(), "torch": torch.__version__},
            "common": COMMON, "runs": runs}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _close(got: float, want: float) -> bool:
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return abs(got - want) <= ATOL + RTOL * abs(want)


def mismatches(got: dict, want: dict) -> list[str]:
    """One line per differing run / step / field (or run set, step list, config)."""
    out = []
    if want["common"] != got["common"] or set(want["runs"]) != set(got["runs"]):
        out.append(f"the golden file's runs {sorted(want['runs'])} / common fields differ from this module's; "
                   f"regenerate: {REGENERATE}")
    for name in sorted(set(want["runs"]) & set(got["runs"])):
        w, g = want["runs"][name], got["runs"][name]
        if w["overrides"] != g["overrides"]:
            out.append(f"run {name}: golden overrides {w['overrides']} != module's {g['overrides']}")
            continue
        changed = {k: (v, g["config"][k]) for k, v in w["config"].items() if k in g["config"] and g["config"][k] != v}
        hint = f" (config defaults changed since the golden file: golden vs now {changed})" if changed else ""
        if [s["step"] for s in w["steps"]] != [s["step"] for s in g["steps"]]:
            out.append(f"run {name}: logged steps {[s['step'] for s in g['steps']]}, "
                       f"golden {[s['step'] for s in w['steps']]}{hint}")
            continue
        for ws, gs in zip(w["steps"], g["steps"]):
            for f in FIELDS:
                if not _close(gs[f], ws[f]):
                    out.append(f"run {name} step {ws['step']} field {f}: got {gs[f]!r}, golden {ws[f]!r} "
                               f"(diff {gs[f] - ws[f]:.3g}){hint}")
    return out


def test_golden_losses(tiny, tiny_store, tmp_path):
    got = golden_numbers(tiny, tiny_store, tmp_path)
    if os.environ.get(WRITE_ENV) == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
        return
    assert GOLDEN.exists(), f"no golden file {GOLDEN}; write it: {REGENERATE}"
    bad = mismatches(got, json.loads(GOLDEN.read_text()))
    assert not bad, (f"{len(bad)} golden-loss mismatches (rtol {RTOL}, atol {ATOL}); if the change is deliberate, "
                     f"regenerate: {REGENERATE}\n" + "\n".join(bad))


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(f"usage: {REGENERATE}   (rewrites {GOLDEN})")
        return 2
    import pytest

    os.environ[WRITE_ENV] = "1"
    code = pytest.main(["-q", "-p", "no:cacheprovider", f"{__file__}::test_golden_losses"])
    print(f"wrote {GOLDEN}" if code == 0 else f"pytest exit {code}: {GOLDEN} not (fully) written")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
