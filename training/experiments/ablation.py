"""Remedy x weighting ablation (scripts/ablate_recipe.py): one ``training.train.run`` of the same base
config per (recipe, weighting), its MI curve, the table and the MI-against-step figure.

Runs live in OUT/<recipe>__<weighting>/ (each with its config.json and metrics.jsonl); a
finished cell's result.json is its commit point, and such a cell is not run again.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tokweight.pipeline.synth import load_synth_config
from tokweight.report.plots import figure
from tokweight.report.tables import markdown_table
from tokweight.store.durable import write_json_atomic
from tokweight.training.experiments.recipes import with_recipe

WEIGHTINGS = ("uniform", "sum", "surprisal-share")


def strategy_count(data: str, k: int) -> int:
    """S: the dataset's number of strategies (a synthetic dataset's config), else K."""
    synth = load_synth_config(data)
    return len(synth.strategies) if synth is not None else k


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, MI, NMI) of every validation line of a run, periodic and final."""
    from tokweight.training.run_dir import read_metrics

    return [(r["step"], r["mi"], r.get("strategy_nmi", float("nan"))) for r in read_metrics(run_dir)
            if r.get("split") == "val"]


def first_step_at(points: list[tuple[int, float, float]], threshold: float) -> int | None:
    return next((step for step, mi, _ in points if mi >= threshold), None)


def run_cell(base, recipe: str, weighting: str, run_dir: Path) -> dict:
    """The train result of ``base`` (a TrainConfig) under ``recipe`` and ``weighting`` in ``run_dir``."""
    from tokweight.training.train import run

    done = run_dir / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    cfg = replace(base, io=replace(base.io, out=str(run_dir)), loss=replace(base.loss, weighting=weighting))
    result = run(with_recipe(cfg, recipe))
    write_json_atomic(done, result)
    return result


def measure(base, recipe: str, weighting: str, out: Path, log_s: float) -> dict:
    """One cell's entry of ablation.json: its final numbers, the step MI first reached 0.5 log S, its curve."""
    run_dir = out / f"{recipe}__{weighting}"
    result = run_cell(base, recipe, weighting, run_dir)
    points = curve(run_dir)
    return {"recipe": recipe, "weighting": weighting, "seed": base.optim.seed, "steps": base.optim.steps,
            "beta": base.loss.beta.beta,
            "mi": result["mi"], "strategy_nmi": result.get("strategy_nmi", float("nan")),
            "val_examples": result["examples"], "train_wall_s": result["train_wall_s"],
            "steps_to_half": first_step_at(points, 0.5 * log_s), "curve": points}


def table(cells: list[dict], log_s: float) -> str:
    headers = ["recipe", "weighting", f"MI (nats; 0.9 log S = {0.9 * log_s:.3f})", "MI / log S", "strategy NMI",
               "steps to MI >= 0.5 log S"]
    return markdown_table(headers, [[c["recipe"], c["weighting"], f"{c['mi']:.3f}", f"{c['mi'] / log_s:.2f}",
                                     f"{c['strategy_nmi']:.3f}",
                                     "not reached" if c["steps_to_half"] is None else str(c["steps_to_half"])]
                                    for c in cells]) + "\n"


def plot(cells: list[dict], log_s: float, path: Path) -> None:
    """MI against step, a panel per weighting, a line per recipe; dashed 0.9 log S, dotted 0.5 log S."""
    fig, axes = figure(len(WEIGHTINGS), width=4.2, height=3.4, sharey=True)
    for ax, weighting in zip(axes, WEIGHTINGS):
        for c in (c for c in cells if c["weighting"] == weighting):
            steps, mi, _ = zip(*c["curve"])
            ax.plot(steps, mi, marker=".", label=c["recipe"])
        ax.axhline(0.9 * log_s, color="grey", ls="--", lw=0.8)
        ax.axhline(0.5 * log_s, color="grey", ls=":", lw=0.8)
        ax.set(title=weighting, xlabel="step")
    axes[0].set_ylabel("exact MI (nats)")
    axes[-1].legend(fontsize=8)
    fig.savefig(path, dpi=120)
