"""What every job's results share: cells' rows -> mean ± std over seeds; when z counts as kept and beta_c, the
largest beta of a table that kept it; the CSV files, the config file and the Markdown header.

Everything here takes plain data (rows, dicts, a job's config as ``dataclasses.asdict`` gives it), so every job
imports it and it imports no job.
"""

from __future__ import annotations

import csv
import math
import os
import platform
from dataclasses import asdict
from pathlib import Path

from tokweight.store.durable import write_json_atomic
from tokweight.report.tables import MISSING
from tokweight.experiments.cells import DIAGNOSTICS, METRICS

# ---------------------------------------------------------------- mean ± std over seeds

GROUP_KEYS = ("group", "setting", "latent", "cond", "weighting", "beta")


def mean_std(values: list) -> tuple[float | None, float | None]:
    """Mean and population std of the values that exist (None: no value)."""
    import numpy as np

    vals = [v for v in values if v is not None]
    return (float(np.mean(vals)), float(np.std(vals))) if vals else (None, None)


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (group, setting, latent, pathway, weighting, beta): mean and std over seeds of METRICS."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in GROUP_KEYS), []).append(r)
    return [seed_stats(dict(zip(GROUP_KEYS, key)), rs) for key, rs in groups.items()]


def seed_stats(group: dict, rows: list[dict]) -> dict:
    """The group's columns, the seeds it has, and mean and std of every metric over them."""
    out = {**group, "recipe": rows[0]["recipe"], "ratio_true": rows[0]["ratio_true"],
           "ratio_inspect": rows[0]["ratio_inspect"], "n_seeds": len(rows),
           "seeds": ";".join(str(r["seed"]) for r in rows)}
    for m in METRICS + DIAGNOSTICS:
        out[f"{m}_mean"], out[f"{m}_std"] = mean_std([r.get(m) for r in rows])  # cells older than a metric lack it
    return out


def pm(row: dict, metric: str) -> str:
    """``metric``'s "mean ± std" over seeds in an aggregated row."""
    mean, std = row.get(f"{metric}_mean"), row.get(f"{metric}_std")
    return MISSING if mean is None else f"{mean:.3f} ± {std:.3f}"


# ---------------------------------------------------------------- beta_c (when z counts as kept: training.evaluation.metrics)

PREDICTION_TOLERANCE = 1.5
"""The factor within which a measured beta_c counts as predicted by the store (issue #18's target)."""
NO_BETA = "none"
"""What a table says when no beta of the grid kept z (beta_c does not exist; it is not 0)."""
CRITERIA = {"mi": "exact I(z; x,y)", "strategy_mi": "exact I(z; strategy)"}
"""Per-cell MI columns beta_c is computed from: the issue's definition, and its strategy-only variant."""


def log_grid(lo: float, hi: float, n: int) -> tuple[float, ...]:
    """n log-spaced values from lo to hi, rounded to 4 significant digits (readable keys and labels)."""
    step = (math.log(hi) - math.log(lo)) / (n - 1) if n > 1 else 0.0
    return tuple(float(f"{math.exp(math.log(lo) + step * i):.4g}") for i in range(n))


def beta_c(mi_by_beta: dict[float, float | None], threshold: float) -> float | None:
    """The largest beta whose MI >= threshold; None when no beta in the table kept z."""
    kept = [b for b, mi in mi_by_beta.items() if mi is not None and mi >= threshold]
    return max(kept) if kept else None


def bracket(betas: tuple[float, ...], found: float | None) -> tuple[float, float] | None:
    """(beta_c, the next grid beta above it): where bisection looks; None at either end of the grid."""
    if found is None or found >= betas[-1]:
        return None
    return found, min(b for b in betas if b > found)


def show(beta: float | None) -> str:
    return NO_BETA if beta is None else f"{beta:.4g}"


def midpoint(span: tuple[float, float]) -> float:
    """The log-scale midpoint of (lo, hi), to 4 significant digits (a readable key and label)."""
    return float(f"{math.sqrt(span[0] * span[1]):.4g}")


def narrow(span: tuple[float, float], mid: float, mi: float, threshold: float) -> tuple[float, float]:
    """span = (a beta that kept z, a larger one that did not): the half that still brackets beta_c,
    given the MI measured at its midpoint."""
    return (mid, span[1]) if mi >= threshold else (span[0], mid)


def suffix(metric: str) -> str:
    """Column suffix of a criterion: "" for the definition ("mi"), "_strategy_mi" for the variant."""
    return "" if metric == "mi" else f"_{metric}"


# ---------------------------------------------------------------- files


def write_csv(path: Path, rows: list[dict]) -> None:
    """Every key of any row is a column (first-seen order); None is an empty cell. Written, then renamed."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    tmp.replace(path)


def write_table_run(out: Path, name: str, rows: list[dict], table: str, note: str) -> None:
    """A table script's outputs: OUT/cells.csv (every cell's record), OUT/<name>.md (the table and the note: seeds,
    wall time, the command that made it), and the same markdown printed."""
    write_csv(out / "cells.csv", rows)
    text = f"{table}\n\n{note}\n"
    (out / f"{name}.md").write_text(text)
    print(text)


def write_config(path: Path, cfg, recipe: dict) -> None:
    """A job's resolved config (a dataclass) and its recipe's overrides, next to its outputs."""
    write_json_atomic(path, {"config": asdict(cfg), "recipe_overrides": recipe})


def machine() -> str:
    import torch

    return (f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"torch {torch.__version__} with {torch.get_num_threads()} thread(s)")


def header_lines(title: str, recipe: str, command: str | None, wall_s: float, task: dict,
                 cells: int, reused: int) -> list[str]:
    """The head of a synthetic job's results file; ``task`` is its TaskConfig as a dict."""
    synth, base = task["synth"], task["base"]
    k = len(synth["strategies"])
    return [f"# {title}", "",
            f"- recipe: `{recipe}`", f"- command: `{command or '(library call)'}`", f"- machine: {machine()}",
            f"- wall time: {wall_s / 60:.1f} min; {cells} cells, {reused} reused from earlier runs",
            f"- task: strategies {', '.join(synth['strategies'])} (K = S = {k}, log S = {math.log(k):.3f} "
            f"nats), alphabet {synth['alphabet_size']}, {synth['n_train']} train / {synth['n_test']} test examples; "
            f"base model {base['n_layer']} layers, d={base['d_model']}, {base['steps']} steps", ""]
