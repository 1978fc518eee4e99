"""`tokweight demo`: the whole pipeline on built-in synthetic data, one stage after another.

synth -> train-base -> extract (store) -> train (discrete CVAE, precomputed surprisal-share)
-> eval -> inspect. Every stage is the library's own `run`, with its outputs under one
directory, so the demo is also the shortest example of using tokweight from Python.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import click


@dataclass(frozen=True)
class DemoConfig:
    out: str = "demo"
    """Directory for data/, base/, store/, cvae/ and report/."""
    preset: str = "small"
    """Synthetic data and base-model preset ("tiny", "small", "default")."""
    cvae_steps: int = 300
    """CVAE optimizer steps."""
    beta: float = 0.3
    """KL weight of the CVAE (RESEARCH-NOTES: weightings separate below beta = 1)."""
    recipe: str = "em-balanced"
    """training.recipes entry: the one that made z learnable (docs/latent-learnability.md)."""
    seed: int = 0

    def __post_init__(self):
        if self.preset not in ("tiny", "small", "default"):
            raise ValueError(f"preset must be tiny, small or default, got {self.preset!r}")
        if self.cvae_steps < 1:
            raise ValueError("cvae_steps must be >= 1")


def run(cfg: DemoConfig, echo=click.echo) -> dict:
    from tokweight.pipeline.extract import ExtractConfig, run as extract
    from tokweight.pipeline.inspect import run as inspect
    from tokweight.pipeline.synth import PRESETS, write_dataset
    from tokweight.store.report import InspectConfig
    from tokweight.training.cvae import CVAEConfig
    from tokweight.training.evaluate import EvalConfig, run_eval
    from tokweight.training.experiments.recipes import with_recipe
    from tokweight.training.schedules import BetaSchedule
    from tokweight.training.train import run as train
    from tokweight.training.train_config import IOConfig, LossConfig, OptimConfig, TrainConfig
    from tokweight.training.train_base import BASE_PRESETS, BaseTrainConfig, run as train_base

    root = Path(cfg.out)
    root.mkdir(parents=True, exist_ok=True)
    (root / "demo_config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")
    paths = {name: root / name for name in ("data", "base", "store", "cvae", "report")}
    timings: dict[str, float] = {}

    def stage(name: str, message: str, fn, *args):
        echo(f"[demo] {name}: {message}")
        start = time.perf_counter()
        out = fn(*args)
        timings[f"{name}_s"] = round(time.perf_counter() - start, 2)
        return out

    synth_cfg = replace(PRESETS[cfg.preset], seed=cfg.seed)
    k = len(synth_cfg.strategies)
    data = stage("synth", f"{cfg.preset} data -> {paths['data']}",
                 lambda: write_dataset(synth_cfg, paths["data"], overwrite=True))
    base = stage("train-base", f"entangled model -> {paths['base']}", train_base,
                 BaseTrainConfig(data=str(paths["data"]), out=str(paths["base"]), seed=cfg.seed,
                                 **BASE_PRESETS[cfg.preset]))
    store = stage("extract", f"per-token baselines -> {paths['store']}", extract,
                  ExtractConfig(checkpoint=str(paths["base"]), data=str(paths["data"]), store=str(paths["store"])))
    shutil.rmtree(paths["cvae"], ignore_errors=True)  # a run directory would otherwise be resumed
    cvae_cfg = TrainConfig(io=IOConfig(checkpoint=str(paths["base"]), data=str(paths["data"]),
                                       store=str(paths["store"]), out=str(paths["cvae"])),
                           cvae=CVAEConfig(latent="discrete", k=k),
                           loss=LossConfig(weighting="surprisal-share", policy="precomputed",
                                           beta=BetaSchedule(cfg.beta)),
                           optim=OptimConfig(steps=cfg.cvae_steps, seed=cfg.seed))
    stage("train", f"discrete CVAE (K={k}), surprisal-share, precomputed b, recipe {cfg.recipe} -> {paths['cvae']}",
          train, with_recipe(cvae_cfg, cfg.recipe))
    evaluated = stage("eval", "test split", run_eval,
                      EvalConfig(run=str(paths["cvae"]), data=str(paths["data"]), split="test"))
    summary = stage("inspect", f"DuckDB report -> {paths['report']}", inspect,
                    InspectConfig(store=str(paths["store"]), out=str(paths["report"]), data=str(paths["data"])))

    result = {"data": data["stats"], "base": base, "store": store.get("stats", {}),
              "cvae": evaluated["metrics"], "inspect": summary["fingerprints"][0], "timings": timings,
              "report": str(paths["report"] / "report.md")}
    (root / "demo_summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result
